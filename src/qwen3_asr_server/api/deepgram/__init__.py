"""Deepgram's API at /v1/listen (docs/DEEPGRAM.md) for Deepgram's SDK, Pipecat, LiveKit:
`live.py`, `query.py`, `messages.py`, `wire.py` (live); `prerecorded.py`, `response.py`,
`fetch.py` (the POST, a URL's fetch). CLAUDE.md's map says what each one does."""
