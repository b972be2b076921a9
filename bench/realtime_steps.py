"""Live streams on the Qwen engine, its two decode paths side by side (issue 43).

    .venv/bin/python bench/realtime_steps.py [--streams 24] [--seconds 40]

A server on the tiny checkpoint (MAX_NEW_TOKENS=40: random weights never end, so each
final decodes 40 tokens, like ~10 s of real speech) takes N `/ws/transcribe` streams at
real-time pace (bench/stream_load.py: real speech, then a pause, in a loop). With
`QWEN_DECODE=generate` every final is its own engine call; with `steps` the finals and
partials of all streams share decode steps. Prints each final's latency after the end of
its speech was sent (the end-of-speech silence included) and the rows per decode step.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from common import pct, tiny_qwen

import httpx

from batch_metrics import batch_sizes
from proc import ServerProcess

LOAD = Path(__file__).with_name("stream_load.py")


def run(decode: str, streams: int, seconds: float) -> dict[str, float]:
    env = {
        "MODEL_ID": str(tiny_qwen()),
        "DEVICE": "cpu",
        "MAX_NEW_TOKENS": "40",
        "MAX_BATCH_SIZE": "16",
        "WS_MAX_SESSIONS": str(streams),
        "QWEN_DECODE": decode,
        "PRELOAD": "true",
        "IDLE_TIMEOUT": "0",
        "LOG_LEVEL": "WARNING",
    }
    server = ServerProcess(env)
    try:
        server.wait_healthy(120)
        httpx.post(  # the model is loaded before the streams start
            server.url + "/v1/audio/transcriptions",
            files={
                "file": (
                    "s.wav",
                    (
                        Path(__file__).parent.parent / "tests/data/speech/sentence_01.wav"
                    ).read_bytes(),
                )
            },
            data={"model": "m"},
            timeout=120,
        )
        command = [sys.executable, str(LOAD), server.url, str(streams), str(seconds), "ws", "100"]
        out = subprocess.run(
            command, capture_output=True, text=True, check=True, timeout=seconds + 300
        )
        got = json.loads(out.stdout.strip().splitlines()[-1])
        finals = got["finals"] or [float("nan")]
        rows = {p: s.mean for p, s in batch_sizes(server.url).items()}
        return {
            "finals": len(got["finals"]),
            "p50": pct(finals, 50),
            "p95": pct(finals, 95),
            "rows_final": rows.get("final", 0.0),
            "rows_partial": rows.get("partial", 0.0),
            "dropped": got["dropped"],
        }
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=24)
    parser.add_argument("--seconds", type=float, default=40.0)
    args = parser.parse_args()
    results = {d: run(d, args.streams, args.seconds) for d in ("generate", "steps")}
    print(f"{args.streams} /ws/transcribe streams for {args.seconds:.0f} s, tiny Qwen on CPU:")
    print(
        "| QWEN_DECODE | finals | final p50 | final p95 | jobs per final step | per partial step |"
    )
    print("|---|---|---|---|---|---|")
    for decode, r in results.items():
        print(
            f"| {decode} | {r['finals']:.0f} | {r['p50']:.2f} s | {r['p95']:.2f} s | "
            f"{r['rows_final']:.2f} | {r['rows_partial']:.2f} |"
        )


if __name__ == "__main__":
    main()
