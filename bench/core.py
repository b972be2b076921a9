"""Core server benchmark (issue 2): idle RSS, time to healthy, per-request overhead.

    .venv/bin/python bench/core.py [--requests 50] [--model DIR]

Runs `python -m qwen3_asr_server` as a real process on the tiny Qwen3-ASR checkpoint (the
real weights cannot be downloaded here; the overhead measured is the server's, not the
model's). Overhead = client end-to-end latency minus the engine's own time, which the
server reports in its Server-Timing header.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

from common import parse_server_timing, summary, tiny_qwen

import httpx

from audio_files import wav_bytes
from proc import ServerProcess


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    model = str(args.model or tiny_qwen())
    env = {"MODEL_ID": model, "MAX_NEW_TOKENS": "8", "LOG_LEVEL": "WARNING"}

    startup, idle_rss = [], []
    for _ in range(args.starts):
        server = ServerProcess(env)
        try:
            startup.append(server.wait_healthy())
            time.sleep(0.5)
            idle_rss.append(server.rss_mb())
        finally:
            server.stop()
    print(f"time to first 200 on /health: {summary(startup)}  (goal < 2000 ms)")
    print(
        f"idle RSS before first request: median {statistics.median(idle_rss):.1f} MB "
        "(goal < 100 MB)"
    )

    server = ServerProcess(env)
    try:
        server.wait_healthy()
        clip = wav_bytes(5.0)
        with httpx.Client(base_url=server.url, timeout=120) as client:

            def one() -> tuple[float, dict[str, float]]:
                started = time.perf_counter()
                response = client.post(
                    "/v1/audio/transcriptions",
                    files={"file": ("clip.wav", clip)},
                    data={"language": "en"},
                )
                elapsed = time.perf_counter() - started
                response.raise_for_status()
                return elapsed, parse_server_timing(response.headers["server-timing"])

            one()  # first request loads the model; not counted
            loaded_rss = server.rss_mb()
            e2e, overhead, decode, engine = [], [], [], []
            for _ in range(args.requests):
                elapsed, timing = one()
                e2e.append(elapsed)
                engine.append(timing["engine"])
                decode.append(timing["decode"])
                overhead.append(elapsed - timing["engine"])
        print(f"5 s clip end-to-end: {summary(e2e)}")
        print(f"engine time: {summary(engine)}")
        print(f"decode time (inside server): {summary(decode)}")
        print(f"per-request overhead (e2e - engine): {summary(overhead)}  (goal p50 < 20 ms)")
        print(f"RSS with the (tiny) model loaded: {loaded_rss:.1f} MB")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
