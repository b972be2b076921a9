"""A Twilio Media Streams -> /v1/listen bridge (docs/CALLS.md).

Twilio's `<Stream>` sends a call's audio to a WebSocket as JSON messages (`connected`,
`start`, `media` with base64 8 kHz mu-law, `stop`) and accepts only `media`, `mark` and
`clear` back, so transcripts cannot go back on that socket: this bridge opens one Deepgram
`/v1/listen` stream per track (the caller `inbound`, the callee `outbound`) on a
qwen3-asr-server and hands each final to `deliver()`, which prints one JSON line and, with
TRANSCRIPT_WEBHOOK set, POSTs it there. A track's last line is `{"call", "track", "done"}`.

    pip install fastapi uvicorn websockets httpx
    ASR_URL=ws://127.0.0.1:8100 API_KEY=... uvicorn twilio_bridge:app --port 8080

TwiML, for both sides of a call (`<Start>` forks the audio and the call goes on):

    <Response><Start><Stream url="wss://bridge.example.com/twilio" track="both_tracks"/>
    </Start><Dial>...</Dial></Response>
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
from typing import Any

import httpx
import websockets
from fastapi import FastAPI, WebSocket, WebSocketDisconnect

ASR_URL = os.environ.get("ASR_URL", "ws://127.0.0.1:8100")
API_KEY = os.environ.get("API_KEY", "")
WEBHOOK = os.environ.get("TRANSCRIPT_WEBHOOK", "")
QUERY = "encoding=mulaw&sample_rate=8000&channels=1&interim_results=false&endpointing=300"

app = FastAPI()


async def deliver(line: dict[str, Any]) -> None:
    print(json.dumps(line), flush=True)
    if WEBHOOK:
        async with httpx.AsyncClient(timeout=10) as client:
            await client.post(WEBHOOK, json=line)


async def transcripts(asr: Any, call: str, track: str) -> None:
    """Every final of one track's stream, until the server closes it after CloseStream."""
    async for raw in asr:
        msg = json.loads(raw)
        if msg.get("type") == "Error":
            print(json.dumps({"call": call, "track": track, "error": msg}), flush=True)
        if msg.get("type") != "Results" or not msg["is_final"]:
            continue
        text = msg["channel"]["alternatives"][0]["transcript"]
        if text:
            start = msg["start"]
            end = round(start + msg["duration"], 3)
            await deliver({"call": call, "track": track, "start": start, "end": end, "text": text})
    print(json.dumps({"call": call, "track": track, "done": True}), flush=True)


@app.websocket("/twilio")
async def twilio(ws: WebSocket) -> None:
    await ws.accept()
    streams: dict[str, Any] = {}  # track -> its /v1/listen socket
    readers: list[asyncio.Task[None]] = []
    call = ""
    headers = {"Authorization": f"Token {API_KEY}"} if API_KEY else {}
    try:
        while True:
            msg = json.loads(await ws.receive_text())
            if msg["event"] == "start":
                call = msg["start"]["callSid"]
                for track in msg["start"].get("tracks", ["inbound"]):
                    url = f"{ASR_URL}/v1/listen?{QUERY}"
                    asr = await websockets.connect(url, additional_headers=headers)
                    streams[track] = asr
                    readers.append(asyncio.create_task(transcripts(asr, call, track)))
            elif msg["event"] == "media":
                media = msg["media"]
                to = streams.get(media.get("track", "inbound"))
                if to is not None:
                    await to.send(base64.b64decode(media["payload"]))
            elif msg["event"] == "stop":
                break
    except WebSocketDisconnect:
        pass  # the call ended without a stop message: finish the same way
    finally:
        for asr in streams.values():  # the last words, then the server closes the stream
            with contextlib.suppress(websockets.ConnectionClosed):
                await asr.send(json.dumps({"type": "CloseStream"}))
        await asyncio.gather(*readers, return_exceptions=True)
        for asr in streams.values():
            await asr.close()
