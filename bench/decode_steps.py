"""Milliseconds per decode step, Qwen's two decode paths side by side (issue 43).

    .venv/bin/python bench/decode_steps.py                      # the tiny checkpoint, CPU
    .venv/bin/python bench/decode_steps.py --device cuda --checkpoint DIR

For batch 1, 8 and 32 (10 s clips of noise: random weights never end, so every row runs to
its budget), the time of a decode with 41 tokens per row minus one with 1 token (the
prefill), divided by 40: what one step costs, prefill excluded. `generate` is
transformers' generate on a padded batch (QWEN_DECODE=generate); `steps` our loop with its
static KV cache (QWEN_DECODE=steps; CUDA graphs on CUDA). On the tiny checkpoint this is
almost all host overhead: the Python and dispatch work around each step.
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import tiny_qwen

from gpu_check import noise, sync
from qwen3_asr_server.engines.base import TranscribeRequest
from qwen3_asr_server.engines.qwen.engine import QwenEngine

STEPS = 40


def timed_batch(engine: QwenEngine, batch: int, tokens: int, repeat: int) -> float:
    engine._max_new_tokens = tokens
    requests = [TranscribeRequest(noise(10, i)) for i in range(batch)]
    times = []
    for _ in range(repeat):
        sync()
        started = time.perf_counter()
        engine.transcribe_batch(requests)
        sync()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--checkpoint", help="a Qwen3-ASR directory (default: the tiny one)")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    path = args.checkpoint or str(tiny_qwen())
    batches = [int(b) for b in args.batches.split(",")]
    results: dict[str, dict[int, float]] = {}
    for decode in ("generate", "steps"):
        engine = QwenEngine(
            path, device=args.device, decode=decode, rows=max(batches), kv_tokens=1024
        )
        engine.load()
        try:
            timed_batch(engine, 1, 2, 1)  # warm-up (and CUDA graph capture for batch 1)
            results[decode] = {}
            for batch in batches:
                timed_batch(engine, batch, STEPS + 1, 1)  # warm-up at this size
                full = timed_batch(engine, batch, STEPS + 1, args.repeat)
                prefill = timed_batch(engine, batch, 1, args.repeat)
                results[decode][batch] = (full - prefill) / STEPS * 1000
        finally:
            engine.unload()
    print(f"ms per decode step ({args.device}, {path}):")
    print("| batch | generate | steps | generate / steps |")
    print("|---|---|---|---|")
    for batch in batches:
        g, s = results["generate"][batch], results["steps"][batch]
        print(f"| {batch} | {g:.2f} | {s:.2f} | {g / s:.2f}x |")


if __name__ == "__main__":
    main()
