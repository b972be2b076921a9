"""A Twilio Media Streams -> /v1/listen bridge (docs/CALLS.md).

Twilio's `<Stream>` sends a call's audio to a WebSocket as JSON messages (`connected`,
`start`, `media` with base64 8 kHz mu-law, `stop`) and accepts only `media`, `mark` and
`clear` back, so transcripts cannot go back on that socket: this bridge opens one Deepgram
`/v1/listen` stream per track (the caller `inbound`, the callee `outbound`) on a
qwen3-asr-server and hands each final to `deliver()`, which prints one JSON line and, with
TRANSCRIPT_WEBHOOK set, POSTs it there. A track's last line is `{"call", "track", "done"}`.

    pip install fastapi uvicorn websockets httpx
    ASR_URL=ws://127.0.0.1:8100 API_KEY=... BRIDGE_TOKEN=... uvicorn twilio_bridge:app --port 8080

TwiML, for both sides of a call (`<Start>` forks the audio and the call goes on). Twilio's
stream URL takes no query string, so the bridge's secret travels as a `<Parameter>`: a
`start` without it is refused before any stream is opened.

    <Response><Start><Stream url="wss://bridge.example.com/twilio" track="both_tracks">
      <Parameter name="token" value="BRIDGE_TOKEN"/></Stream></Start><Dial>...</Dial></Response>
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import json
import os
import sys
from typing import Any

import httpx
import websockets
from fastapi import FastAPI, WebSocket, WebSocketDisconnect

ASR_URL = os.environ.get("ASR_URL", "ws://127.0.0.1:8100")
API_KEY = os.environ.get("API_KEY", "")
BRIDGE_TOKEN = os.environ.get("BRIDGE_TOKEN", "")
WEBHOOK = os.environ.get("TRANSCRIPT_WEBHOOK", "")
QUERY = "encoding=mulaw&sample_rate=8000&channels=1&interim_results=false&endpointing=300"

app = FastAPI()


def say(line: dict[str, Any]) -> None:
    print(json.dumps(line), flush=True)


async def deliver(lines: asyncio.Queue[dict[str, Any] | None]) -> None:
    """Print each line and POST it to TRANSCRIPT_WEBHOOK: a slow or failing webhook is
    logged and never holds up the transcription (the ASR server drops slow readers)."""
    async with httpx.AsyncClient(timeout=10) as client:
        while (line := await lines.get()) is not None:
            say(line)
            if WEBHOOK and "text" in line:
                try:
                    (await client.post(WEBHOOK, json=line)).raise_for_status()
                except httpx.HTTPError as e:
                    print(f"webhook: {e!r}", file=sys.stderr, flush=True)


async def transcripts(asr: Any, call: str, track: str, out: asyncio.Queue[Any]) -> None:
    """Every final of one track's stream, until the server closes it (after CloseStream)."""
    try:
        async for raw in asr:
            msg = json.loads(raw)
            if msg.get("type") == "Error":
                out.put_nowait({"call": call, "track": track, "error": msg})
            if msg.get("type") != "Results" or not msg["is_final"]:
                continue
            if text := msg["channel"]["alternatives"][0]["transcript"]:
                start, end = msg["start"], round(msg["start"] + msg["duration"], 3)
                out.put_nowait(
                    {"call": call, "track": track, "start": start, "end": end, "text": text}
                )
    except websockets.ConnectionClosedError as e:
        out.put_nowait({"call": call, "track": track, "error": f"stream closed: {e}"})
    out.put_nowait({"call": call, "track": track, "done": True})


def allowed(start: dict[str, Any]) -> bool:
    token = str(start.get("customParameters", {}).get("token", ""))
    # (as bytes: compare_digest refuses a str that is not ASCII)
    return not BRIDGE_TOKEN or hmac.compare_digest(token.encode(), BRIDGE_TOKEN.encode())


async def open_stream(call: str, track: str, out: asyncio.Queue[Any]) -> Any:
    """One track's /v1/listen stream; None, with its error and `done` lines, when it cannot
    be opened (429: the server is full, 401, down): the other track goes on."""
    headers = {"Authorization": f"Token {API_KEY}"} if API_KEY else {}
    try:
        return await websockets.connect(f"{ASR_URL}/v1/listen?{QUERY}", additional_headers=headers)
    except (OSError, websockets.InvalidHandshake, TimeoutError) as e:
        out.put_nowait({"call": call, "track": track, "error": f"stream not opened: {e}"})
        out.put_nowait({"call": call, "track": track, "done": True})
        return None


@app.websocket("/twilio")
async def twilio(ws: WebSocket) -> None:
    await ws.accept()
    streams: dict[str, Any] = {}  # track -> its /v1/listen socket
    readers: list[asyncio.Task[None]] = []
    lines: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    delivering = asyncio.create_task(deliver(lines))
    started = False
    try:
        while True:
            msg = json.loads(await ws.receive_text())
            if msg["event"] == "start" and not started:
                started = True
                if not allowed(msg["start"]):
                    await ws.close(1008, "bad token")
                    break
                call = msg["start"]["callSid"]
                for track in msg["start"].get("tracks", ["inbound"]):
                    if (asr := await open_stream(call, track, lines)) is not None:
                        streams[track] = asr
                        readers.append(asyncio.create_task(transcripts(asr, call, track, lines)))
            elif msg["event"] == "media":
                media = msg["media"]
                to = streams.get(media.get("track", "inbound"))
                with contextlib.suppress(websockets.ConnectionClosed):  # its reader says why
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
        with contextlib.suppress(Exception):  # (Twilio sees a close, not a dropped socket)
            await ws.close()
        lines.put_nowait(None)
        await delivering
