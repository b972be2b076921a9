"""Deepgram's API at /v1/listen (docs/DEEPGRAM.md): voice agents built on Deepgram's SDK,
Pipecat or LiveKit point their base URL here. `live.py`: the WebSocket route; `query.py`:
its query; `messages.py`: every message as a model; `wire.py`: stream events -> messages;
`prerecorded.py` with `response.py`: the pre-recorded POST."""
