"""Whisper engine benchmark (issue 3): RTF and latency for 5 s and 60 s clips, sequential
and 4 concurrent, and the share of each request spent outside the engine.

    .venv/bin/python bench/whisper.py [--model whisper-tiny.en]

The clips are cut from the committed 2-minute espeak-ng fixture.
"""

from __future__ import annotations

import argparse
import io
import logging
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from common import parse_server_timing, summary

import httpx
import soundfile as sf

import speech
from proc import ServerProcess


def clip(seconds: float) -> bytes:
    audio, rate = sf.read(speech.path("long_2min.wav"), dtype="float32")
    buf = io.BytesIO()
    sf.write(buf, audio[: int(seconds * rate)], rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def run(url: str, data: bytes, requests: int, concurrency: int) -> list[tuple[float, float, float]]:
    client = httpx.Client(base_url=url, timeout=600, limits=httpx.Limits(max_connections=8))

    def one(_: int) -> tuple[float, float, float]:
        started = time.perf_counter()
        response = client.post(
            "/v1/audio/transcriptions",
            files={"file": ("clip.wav", data)},
            data={"language": "en"},
        )
        elapsed = time.perf_counter() - started
        response.raise_for_status()
        timing = parse_server_timing(response.headers["server-timing"])
        return elapsed, timing["engine"], timing["queue"]

    with client, ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, range(requests)))


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="whisper-tiny.en")
    args = parser.parse_args()
    server = ServerProcess({"MODEL_ID": args.model, "LOG_LEVEL": "WARNING"})
    try:
        server.wait_healthy()
        run(server.url, clip(5), 1, 1)  # load the model
        for seconds, requests in ((5.0, 12), (60.0, 4)):
            data = clip(seconds)
            for concurrency in (1, 4):
                started = time.perf_counter()
                results = run(server.url, data, requests, concurrency)
                wall = time.perf_counter() - started
                e2e = [r[0] for r in results]
                engine = [r[1] for r in results]
                rtf = statistics.mean(engine) / seconds
                outside = statistics.mean((a - b) / a for a, b, _ in results)
                in_server = statistics.mean((a - b - q) / a for a, b, q in results)
                print(
                    f"{seconds:>4.0f} s clip, concurrency {concurrency}: e2e {summary(e2e)}; "
                    f"engine RTF {rtf:.3f}; outside engine {outside * 100:.1f}% of e2e "
                    f"(queue wait included), {in_server * 100:.1f}% without the queue wait; "
                    f"throughput {requests * seconds / wall:.1f} "
                    "audio-s/s"
                )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
