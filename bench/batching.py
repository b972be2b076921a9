"""Batching benchmark (issue 4): throughput of concurrent uploads with MAX_BATCH_SIZE=1
(off) and 4, on both engines.

    .venv/bin/python bench/batching.py [--requests 8] [--seconds 25]
"""

from __future__ import annotations

import argparse
import io
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from common import tiny_qwen

import httpx
import soundfile as sf

import speech
from proc import ServerProcess


def clips(seconds: float, count: int) -> list[bytes]:
    """`count` different clips of `seconds` cut from the 2-minute fixture."""
    audio, rate = sf.read(speech.path("long_2min.wav"), dtype="float32")
    out = []
    for i in range(count):
        start = int((i * 7.3 % 90) * rate)
        buf = io.BytesIO()
        sf.write(buf, audio[start : start + int(seconds * rate)], rate, format="WAV")
        out.append(buf.getvalue())
    return out


def throughput(env: dict[str, str], data: list[bytes], seconds: float) -> float:
    server = ServerProcess({**env, "LOG_LEVEL": "WARNING"})
    try:
        server.wait_healthy()
        with httpx.Client(base_url=server.url, timeout=600) as client:

            def one(payload: bytes) -> None:
                client.post(
                    "/v1/audio/transcriptions",
                    files={"file": ("a.wav", payload)},
                    data={"language": "en"},
                ).raise_for_status()

            one(data[0])  # load
            started = time.perf_counter()
            with ThreadPoolExecutor(len(data)) as pool:
                list(pool.map(one, data))
            return len(data) * seconds / (time.perf_counter() - started)
    finally:
        server.stop()


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=25.0)
    args = parser.parse_args()
    data = clips(args.seconds, args.requests)
    engines = {
        "whisper-tiny.en": {"MODEL_ID": "whisper-tiny.en"},
        "qwen (tiny checkpoint)": {"MODEL_ID": str(tiny_qwen()), "MAX_NEW_TOKENS": "16"},
    }
    for name, env in engines.items():
        results = {}
        for size in (1, 4):
            results[size] = throughput({**env, "MAX_BATCH_SIZE": str(size)}, data, args.seconds)
        print(
            f"{name}: {args.requests} concurrent {args.seconds:g} s uploads: "
            f"unbatched {results[1]:.1f} audio-s/s, MAX_BATCH_SIZE=4 {results[4]:.1f} audio-s/s, "
            f"ratio {results[4] / results[1]:.2f}x"
        )


if __name__ == "__main__":
    main()
