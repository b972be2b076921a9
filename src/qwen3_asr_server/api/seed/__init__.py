"""The seed server's protocol: WS /ws/transcribe, its text actions and its wire."""
