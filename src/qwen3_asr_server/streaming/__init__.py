"""Real-time streaming: the session core shared by /ws/transcribe and /v1/realtime."""
