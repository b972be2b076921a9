"""The load generator of bench/front_capacity.py, run as its own process: N live streams at
real-time pace, each replaying real speech (the fixtures' three_sentences.wav, then a pause)
in a loop, over one of three protocols:

- `ws`: `/ws/transcribe`, 16 kHz s16le PCM;
- `realtime`: `/v1/realtime` (OpenAI Realtime transcription), 24 kHz PCM in base64;
- `pcmu`: `/v1/realtime` with `audio/pcmu` (G.711 μ-law, 8 kHz), as telephony bridges send.

    python bench/stream_load.py URL[,URL...] STREAMS SECONDS PROTOCOL CHUNK_MS [CALL_S]

Stream i goes to URL i mod the number of URLs (several fronts behind a balancer). With
CALL_S, each stream is a line of calls of CALL_S seconds, each a new connection. It prints
one JSON line: each final's latency after the end of its speech was sent, each partial's
arrival time, how late each send was (the generator's own lag), the calls completed, and the
streams that ended early (closed by the server, or a broken connection).
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import time
from typing import Any

from common import ROOT  # noqa: F401  (puts tests/ on the path)

import numpy as np
import soxr
from websockets.asyncio.client import ClientConnection, connect

from qwen3_asr_server.audio import g711
from streaming_client import load, pcm16

CLIP = "three_sentences.wav"
PAUSE_S = 2.0  # silence after each replay of the clip
FINAL_EVENTS = {"conversation.item.input_audio_transcription.completed"}
PARTIAL_EVENTS = {"conversation.item.input_audio_transcription.delta"}


def speech_ends(samples: np.ndarray, rate: int = 16000) -> list[float]:
    """Where speech ends in the clip (seconds): a loud 32 ms frame followed by >= 0.3 s
    of quiet frames."""
    frame = 512
    loud = [
        float(np.abs(samples[i : i + frame]).max()) > 0.02 for i in range(0, len(samples), frame)
    ]
    ends, quiet = [], 0
    for i, is_loud in enumerate(loud):
        quiet = 0 if is_loud else quiet + 1
        if quiet == int(0.3 * rate / frame) and i >= quiet:
            ends.append((i - quiet + 1) * frame / rate)
    if loud and loud[-1]:
        ends.append(len(samples) / rate)
    return ends


class Protocol:
    """How one protocol opens a stream, frames audio and tells finals from partials."""

    def __init__(self, name: str, chunk_s: float) -> None:
        self.name = name
        audio = np.concatenate([load(CLIP), np.zeros(int(PAUSE_S * 16000), np.float32)])
        self.rate = {"ws": 16000, "realtime": 24000, "pcmu": 8000}[name]
        if self.rate != 16000:
            audio = soxr.resample(audio, 16000, self.rate).astype(np.float32)
        self.chunk = int(chunk_s * self.rate)
        whole = len(audio) - len(audio) % self.chunk
        raw = g711.encode(audio[:whole], "mulaw") if name == "pcmu" else pcm16(audio[:whole])
        width = 1 if name == "pcmu" else 2
        self.frames = [
            raw[i : i + self.chunk * width] for i in range(0, len(raw), self.chunk * width)
        ]
        self.ends = speech_ends(load(CLIP))  # seconds into each replay

    def path(self) -> str:
        if self.name == "ws":
            return "/ws/transcribe?sample_rate=16000"
        return "/v1/realtime?intent=transcription"

    async def open(self, ws: ClientConnection) -> None:
        await ws.recv()  # connected / session.created
        if self.name == "ws":
            return
        fmt: dict[str, Any] = {"type": "audio/pcm", "rate": 24000}
        if self.name == "pcmu":
            fmt = {"type": "audio/pcmu"}
        session = {
            "type": "transcription",
            "audio": {"input": {"format": fmt, "turn_detection": {"type": "server_vad"}}},
        }
        await ws.send(json.dumps({"type": "session.update", "session": session}))
        while json.loads(await ws.recv()).get("type") != "session.updated":
            pass

    def message(self, frame: bytes) -> bytes | str:
        if self.name == "ws":
            return frame
        audio = base64.b64encode(frame).decode()
        return json.dumps({"type": "input_audio_buffer.append", "audio": audio})

    def kind(self, event: dict[str, Any]) -> str:
        """final | partial | error | other"""
        if self.name == "ws":
            if "code" in event and "statusCode" in event:
                return "error"
            return (
                "final"
                if event.get("is_final")
                else "partial"
                if event.get("is_partial")
                else "other"
            )
        kind = event.get("type")
        if kind == "error":
            return "error"
        return "final" if kind in FINAL_EVENTS else "partial" if kind in PARTIAL_EVENTS else "other"


async def one_call(
    url: str, proto: Protocol, seconds: float, index: int, out: dict[str, Any]
) -> bool:
    """One connection for `seconds`: True when it lasted (the client ended it)."""
    chunk_s = proto.chunk / proto.rate
    spoken_end: list[float] = []  # wall times at which a speech end was sent
    lasted = False
    try:
        async with connect(url + proto.path(), max_size=None, open_timeout=60) as ws:
            await proto.open(ws)

            async def reader() -> None:
                async for raw in ws:
                    event = json.loads(raw)
                    now = time.perf_counter()
                    kind = proto.kind(event)
                    if kind == "final" and spoken_end:
                        out["finals"].append(now - spoken_end[-1])
                    elif kind == "partial":
                        out["partials"].append(now)
                    elif kind == "error":
                        out["errors"].append(str(event)[:200])

            task = asyncio.create_task(reader())
            await asyncio.sleep(index * 0.013 % chunk_s)  # spread the streams over a frame
            started = time.perf_counter()
            sent = 0
            while time.perf_counter() - started < seconds:
                if task.done():  # the server closed the stream
                    break
                frame = proto.frames[sent % len(proto.frames)]
                await ws.send(proto.message(frame))
                sent += 1
                at = (sent % len(proto.frames) or len(proto.frames)) * chunk_s
                if any(at - chunk_s < end <= at for end in proto.ends):
                    spoken_end.append(time.perf_counter())
                due = started + sent * chunk_s
                out["late"].append(max(0.0, time.perf_counter() - due))
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
            else:
                lasted = True
            await asyncio.sleep(2.0)  # the last finals
            task.cancel()
    except Exception as exc:  # a refused or broken connection
        out["errors"].append(f"{type(exc).__name__}: {exc}"[:200])
    return lasted


async def one_stream(
    url: str, proto: Protocol, seconds: float, call_s: float, index: int, out: dict[str, Any]
) -> None:
    """A line of calls for `seconds`: each call lasts `call_s` (0: one call), then the next
    connects (a new session), as calls come and go in a call centre."""
    ends = time.perf_counter() + seconds
    while (left := ends - time.perf_counter()) > 1.0:
        if not await one_call(url, proto, min(left, call_s or left), index, out):
            out["dropped"] += 1
            return
        out["calls"] += 1


async def generate(
    urls: list[str], streams: int, seconds: float, proto: Protocol, call_s: float
) -> dict[str, Any]:
    out: dict[str, Any] = {"finals": [], "partials": [], "late": [], "errors": []}
    out.update(dropped=0, calls=0)
    ws_urls = [u.replace("http://", "ws://") for u in urls]
    await asyncio.gather(
        *(
            one_stream(ws_urls[i % len(ws_urls)], proto, seconds, call_s, i, out)
            for i in range(streams)
        )
    )
    return out


def main() -> None:
    urls, streams, seconds = sys.argv[1].split(","), int(sys.argv[2]), float(sys.argv[3])
    proto = Protocol(sys.argv[4], int(sys.argv[5]) / 1000)
    call_s = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
    print(json.dumps(asyncio.run(generate(urls, streams, seconds, proto, call_s))))


if __name__ == "__main__":
    main()
