"""DUAL_MODEL (issue 16): first-partial latency with and without a fast model for partials.

    .venv/bin/python bench/dual_model.py [--sentences 6]

Main model: random weights of the real Qwen3-ASR-0.6B shape (scripts/tiny_qwen.py, the real
one is not on this offline machine), float32 on CPU. Fast model: the bundled whisper
tiny.en. Each run streams espeak-ng sentences at real-time pace over /ws/transcribe
(language=en) and reports the time from speech start to the first partial, and end of
speech to final (bench/streaming.py's measures).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import pct  # also puts scripts/ and tests/ on sys.path

import speech
from proc import ServerProcess
from streaming import run_stream
from tiny_qwen import build


def measure(env: dict[str, str], names: list[str]) -> dict[str, float]:
    server = ServerProcess({**env, "LOG_LEVEL": "WARNING", "PRELOAD": "true"})
    try:
        server.wait_healthy(timeout=120)
        time.sleep(20)  # PRELOAD of the 0.6B-shape weights
        out: dict[str, list[float] | int] = {}
        run_stream(server.url, names[:1], out, language="en")  # warm-up
        out = {}
        run_stream(server.url, names, out, language="en")
    finally:
        server.stop()
    first, latency = out["first_partial"], out["latency"]
    assert isinstance(first, list) and isinstance(latency, list)
    return {
        "first_p50": pct(first, 50),
        "first_p95": pct(first, 95),
        "final_p50": pct(latency, 50),
        "final_p95": pct(latency, 95),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sentences", type=int, default=6)
    args = parser.parse_args()
    names = sorted(speech.sentences())[: args.sentences]
    with tempfile.TemporaryDirectory() as tmp:
        model = str(build(Path(tmp) / "qwen-0.6b-shape", shape="0.6b"))
        base = {"MODEL_ID": model, "DTYPE": "float32", "MAX_NEW_TOKENS": "64"}
        single = measure(base, names)
        dual = measure({**base, "DUAL_MODEL": "true", "FAST_MODEL_ID": "whisper-tiny.en"}, names)
    print("| metric | MODEL_ID only | + DUAL_MODEL (whisper tiny.en partials) |")
    print("|---|---|---|")
    for key, label in [
        ("first_p50", "first partial after speech start, p50"),
        ("first_p95", "first partial after speech start, p95"),
        ("final_p50", "end of speech → final, p50"),
        ("final_p95", "end of speech → final, p95"),
    ]:
        print(f"| {label} | {single[key] * 1000:.0f} ms | {dual[key] * 1000:.0f} ms |")


if __name__ == "__main__":
    main()
