"""The GPU check: what the Qwen engine does on this machine's CUDA card, offline.

    .venv/bin/python bench/gpu_check.py                    # CUDA: tiny, 0.6b and 1.7b shapes
    .venv/bin/python bench/gpu_check.py --device cpu --shapes tiny   # a smoke run anywhere

Needs no internet: the checkpoints are random-weight models of the real 0.6B/1.7B shapes
(scripts/tiny_qwen.py SHAPES, written to --workdir) plus the tiny test checkpoint and tiny
aligner. Random weights never emit an end token, so every decode runs to its token budget:
that is what the throughput and runaway figures measure. Reports, per shape:
- the dtype and attention the engine chose;
- a batch of mixed lengths (25 s, 3 s, 0.3 s, 12 s) with word timestamps (tiny aligner);
- GPU memory after unload, also after a failed request (must be 0);
- a bf16/fp16 mixed-length batch against single runs: NaN and max logit difference;
- encoder+prefill time for 2/15/30 s (a stand-in for time to first token; the paper's 0.6B
  figure is 92 ms on vLLM), and ms per generated token;
- audio seconds per second at batch 1/4/8/16/32 (10 s clips; vLLM reports 2000 at 128);
- the cost of one runaway 1024-token decode.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from common import ROOT  # noqa: F401  (puts scripts/ and tests/ on sys.path)

import numpy as np

from qwen3_asr_server.engines.base import TranscribeRequest
from qwen3_asr_server.engines.qwen.engine import QwenEngine

RATE = 16000


def noise(seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(int(seconds * RATE)) * 0.1).astype(np.float32)


def cuda_allocated() -> int | None:
    import torch

    return int(torch.cuda.memory_allocated()) if torch.cuda.is_available() else None


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Any) -> tuple[Any, float]:
    sync()
    started = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - started


def checkpoint(workdir: Path, shape: str, aligner: bool = False) -> Path:
    from tiny_qwen import build

    target = workdir / f"qwen-{shape}{'-aligner' if aligner else ''}"
    if not (target / "config.json").exists():
        print(f"  building the random {shape} checkpoint in {target} ...", flush=True)
        build(target, aligner=aligner, shape=shape)
    return target


def mixed_batch(engine: QwenEngine) -> None:
    seconds = [25, 3, 0.3, 12]
    requests = [
        TranscribeRequest(noise(s, i), language="en", word_timestamps=True)
        for i, s in enumerate(seconds)
    ]
    results, took = timed(lambda: engine.transcribe_batch(requests))
    words = [sum(len(s.words) for s in r.segments) for r in results]
    print(f"  mixed batch {seconds} s with word timestamps: {took:.2f} s, words {words}")


def memory_after_unload(engine: QwenEngine) -> None:
    engine.load()

    def explode() -> bool:  # a failure in the middle of generation, tensors on the GPU
        raise RuntimeError("failure injected mid-decode")

    try:
        engine.transcribe(TranscribeRequest(noise(2)), explode)
    except RuntimeError as exc:
        print(f"  failed request as expected: {exc}")
    engine.unload()
    print(f"  GPU memory allocated after unload: {cuda_allocated()} bytes (must be 0)")


def logits_check(engine: QwenEngine) -> None:
    import torch

    model = engine._model
    assert model is not None
    wavs = [noise(12, 1), noise(3, 2)]

    def logits(batch: list[np.ndarray]) -> Any:
        prompt = model._build_text_prompt(context="", force_language="English")
        inputs = model.processor(
            text=[prompt] * len(batch), audio=batch, return_tensors="pt", padding=True
        )
        inputs = inputs.to(model.model.device).to(model.model.dtype)
        with torch.no_grad():
            return model.model.thinker(**inputs).logits[:, -1].float().cpu()

    together = logits(wavs)
    alone = torch.cat([logits([w]) for w in wavs])
    diff = (together - alone).abs().max().item()
    nan = bool(torch.isnan(together).any() or torch.isnan(alone).any())
    print(f"  mixed-length batch vs single runs ({engine.dtype}): max |diff| {diff:.4g}, NaN {nan}")


def speed(engine: QwenEngine) -> None:
    assert engine._model is not None
    for seconds in (2, 15, 30):
        engine._max_new_tokens = 1
        _, prefill = timed(lambda s=seconds: engine.transcribe(TranscribeRequest(noise(s))))
        print(f"  encoder+prefill, {seconds} s of audio: {prefill * 1000:.0f} ms")
    engine._max_new_tokens = 65
    _, one = timed(lambda: engine.transcribe(TranscribeRequest(noise(5))))
    engine._max_new_tokens = 1
    _, first = timed(lambda: engine.transcribe(TranscribeRequest(noise(5))))
    print(f"  decode: {(one - first) / 64 * 1000:.1f} ms per token")
    engine._max_new_tokens = 1024
    for batch in (1, 4, 8, 16, 32):
        requests = [TranscribeRequest(noise(10, i)) for i in range(batch)]
        _, took = timed(lambda r=requests: engine.transcribe_batch(r))
        print(f"  batch {batch:2d} x 10 s (152 tokens each): {batch * 10 / took:.1f} audio s per s")
    _, runaway = timed(lambda: engine.transcribe(TranscribeRequest(noise(90))))
    print(f"  one runaway decode (90 s of audio, budget 1024 tokens): {runaway:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", default="tiny,0.6b,1.7b")
    parser.add_argument("--dtypes", default="auto,float16")
    parser.add_argument("--workdir", default="/tmp/qwen3-asr-gpu-check")
    parser.add_argument("--decode", default="steps", help="QWEN_DECODE: steps or generate")
    args = parser.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    aligner = checkpoint(workdir, "tiny", aligner=True)
    for shape in args.shapes.split(","):
        path = checkpoint(workdir, shape)
        for dtype in args.dtypes.split(","):
            engine = QwenEngine(
                str(path),
                device=args.device,
                dtype=dtype,
                max_new_tokens=1024,
                aligner_id=str(aligner),
                decode=args.decode,
                rows=32,  # the batch sizes below, all in flight
                kv_tokens=2400,  # 90 s of audio (1125 tokens) plus a 1024-token runaway
            )
            print(f"{shape}, DTYPE={dtype}, QWEN_DECODE={args.decode}:", flush=True)
            _, load = timed(engine.load)
            print(
                f"  loaded in {load:.1f} s: device {engine.device}, dtype {engine.dtype}, "
                f"attention {engine.attention}"
            )
            try:
                mixed_batch(engine)
                logits_check(engine)
                if dtype == "auto":
                    speed(engine)
            finally:
                engine.unload()
            print(f"  GPU memory allocated after unload: {cuda_allocated()} bytes")
        memory_after_unload(QwenEngine(str(path), device=args.device, aligner_id=str(aligner)))


if __name__ == "__main__":
    main()
