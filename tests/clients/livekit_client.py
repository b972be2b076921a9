"""LiveKit Agents' Deepgram plugin against a running server's /v1/listen, driven as an agent's
stt_node drives it: `STT.stream()` fed 16 kHz `rtc.AudioFrame`s in real time, then
`end_input()` (Finalize, then CloseStream). Also the same stream with a wrong key, and
`STT.recognize()` (the pre-recorded POST). Prints one JSON object with what it got.

Run with the separate venv `make clients` builds (livekit-agents pins an older openai SDK):
tests/clients/.venv-livekit/bin/python livekit_client.py BASE_URL API_KEY WAV
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import wave
from typing import Any

import aiohttp
from livekit import rtc
from livekit.plugins import deepgram

FRAME = 640  # 20 ms of 16 kHz s16 mono


async def streamed(http: aiohttp.ClientSession, url: str, key: str, pcm: bytes) -> dict[str, Any]:
    """Every event of one stream, with its time since the first frame, and every error. After
    `pcm`, silence goes on in real time (a microphone's) until END_OF_SPEECH, for 20 s at
    most; then `end_input()`."""
    out: dict[str, Any] = {"events": [], "errors": [], "raised": None}
    stt = deepgram.STT(base_url=url + "/v1/listen", api_key=key, http_session=http)
    stt.on("error", lambda e: out["errors"].append([repr(e.error), e.recoverable]))
    stream = stt.stream()  # the plugin's defaults: nova-3, en-US, endpointing=25, vad_events
    start = time.monotonic()
    ended = asyncio.Event()

    async def read() -> None:
        try:
            async for ev in stream:
                alt = ev.alternatives[0] if ev.alternatives else None
                out["events"].append(
                    {
                        "type": ev.type.value,
                        "t": round(time.monotonic() - start, 3),
                        "request_id": ev.request_id,
                        "text": alt.text if alt else None,
                    }
                )
                if ev.type.value == "end_of_speech":
                    ended.set()
        except Exception as exc:  # a refused stream raises from the iterator
            out["raised"] = repr(exc)

    reader = asyncio.create_task(read())
    silence = bytes(FRAME)
    for i in range(0, len(pcm) + 1000 * FRAME, FRAME):
        if reader.done() or (i >= len(pcm) and ended.is_set()):
            break
        chunk = pcm[i : i + FRAME] if i < len(pcm) else silence
        stream.push_frame(rtc.AudioFrame(chunk, 16000, 1, len(chunk) // 2))
        await asyncio.sleep(max(0.0, start + (i + FRAME) / 32000 - time.monotonic()))
    out["input_ended"] = round(time.monotonic() - start, 3)
    if not reader.done():
        stream.end_input()  # a Finalize, then a CloseStream
    await asyncio.wait_for(reader, 30)  # ends once the server closes (<= ~5 s: KeepAlive)
    out["ended"] = round(time.monotonic() - start, 3)
    await stream.aclose()
    return out


async def recognized(http: aiohttp.ClientSession, url: str, key: str, pcm: bytes) -> dict:
    stt = deepgram.STT(base_url=url + "/v1/listen", api_key=key, http_session=http)
    frame = rtc.AudioFrame(pcm, 16000, 1, len(pcm) // 2)
    ev = await stt.recognize([frame])
    return {"type": ev.type.value, "request_id": ev.request_id, "text": ev.alternatives[0].text}


async def main() -> None:
    url, key, path = sys.argv[1:4]
    with wave.open(path) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16000, 1, 2)
        pcm = w.readframes(w.getnframes())
    async with aiohttp.ClientSession() as http:
        out = {
            "stream": await streamed(http, url, key, pcm),
            "wrong_key": await streamed(http, url, "wrong-" + key, pcm[: 10 * FRAME]),
            "recognize": await recognized(http, url, key, pcm),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
