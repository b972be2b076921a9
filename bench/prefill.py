"""Encoder + prefill of Qwen's step path (issue 50), ours beside the SDK's own forward.

    .venv/bin/python bench/prefill.py                          # the tiny checkpoint, CPU
    .venv/bin/python bench/prefill.py --device cuda --checkpoint DIR

For 1 and 32 rows of 10 s (noise), the median time of
- `ours`: the step path's prefill (`Decoder._fill`: our batched, windowed encoder, keys and
  values into the slots, the LM head at the last position, first tokens read back once);
- `sdk`: the thinker's own forward on the same processor output (the SDK's encoder row by
  row, every position's logits): the core of the prefill before issue 50;
the rows' preparation (chat prompt, tokens, log-mel: on the preparer's threads, beside the
steps) apart; the extra time of the first call of a
new audio length (12.3 s, never seen); operators per prefill (torch.profiler events) and
host reads (a TorchFunctionMode count). On CUDA also the GPU waits per prefill
(`torch.cuda.set_sync_debug_mode("warn")`) and CPU against CUDA time per prefill.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Any

from common import tiny_qwen

from gpu_check import noise, sync
from qwen3_asr_server.engines.base import TranscribeRequest
from qwen3_asr_server.engines.qwen.engine import QwenEngine
from qwen3_asr_server.engines.qwen.prefill import Prompts
from qwen3_asr_server.engines.qwen.rows import Row, prompt_for


def rows(engine: QwenEngine, count: int, seconds: float) -> list[Row]:
    assert engine._preparer is not None
    joining = [(i, TranscribeRequest(noise(seconds, i)), None) for i in range(count)]
    return [r for r in engine._preparer(joining).rows() if isinstance(r, Row)]


def ours(engine: QwenEngine, taken: list[Row]) -> float:
    decoder = engine._decoder
    assert decoder is not None
    prompts = Prompts.join([r.prompts for r in taken if r.prompts is not None])
    sync()
    started = time.perf_counter()
    decoder._fill(taken, prompts)
    sync()
    spent = time.perf_counter() - started
    decoder.leave(lambda r: True)
    for row in taken:
        row.record.generated.clear()
    return spent


def sdk(engine: QwenEngine, taken: list[Row]) -> float:
    import torch

    assert engine._model is not None
    model = engine._model
    thinker = model.model.thinker
    inputs = model.processor(
        text=[prompt_for(model, r.request)[0] for r in taken],
        audio=[r.request.audio for r in taken],
        return_tensors="pt",
        padding=True,
    ).to(thinker.device)
    inputs["input_features"] = inputs["input_features"].to(thinker.dtype)
    ours_encoder = thinker.__dict__.pop("get_audio_features")  # the SDK's own, meanwhile
    try:
        sync()
        started = time.perf_counter()
        with torch.inference_mode():
            thinker(**inputs, use_cache=True).logits[:, -1].argmax(-1).tolist()
        sync()
        return time.perf_counter() - started
    finally:
        thinker.get_audio_features = ours_encoder


def processor_time(engine: QwenEngine, taken: list[Row]) -> float:
    """The rows' preparation (chat prompt, tokens, log-mel), as the preparer thread does it."""
    assert engine._preparer is not None
    started = time.perf_counter()
    engine._preparer([(row.handle, row.request, None) for row in taken]).rows()
    return time.perf_counter() - started


def counts(engine: QwenEngine, taken: list[Row]) -> tuple[int, int]:
    """(profiler events, host reads) of one prefill."""
    import torch
    from torch.overrides import TorchFunctionMode

    names = {"item", "tolist", "__bool__", "nonzero", "__index__", "__int__", "__float__"}

    class Reads(TorchFunctionMode):
        count = 0

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kw: Any = None) -> Any:
            if getattr(func, "__name__", "") in names:
                Reads.count += 1
            return func(*args, **(kw or {}))

    decoder = engine._decoder
    assert decoder is not None
    prompts = Prompts.join([r.prompts for r in taken if r.prompts is not None])
    with torch.profiler.profile() as profile:
        decoder._fill(taken, prompts)
    events = len(profile.events())
    decoder.leave(lambda r: True)
    Reads.count = 0
    with Reads():
        decoder._fill(taken, prompts)
    decoder.leave(lambda r: True)
    for row in taken:
        row.record.generated.clear()
    return events, Reads.count


def waits(engine: QwenEngine, taken: list[Row]) -> str:
    import torch

    if not torch.cuda.is_available():
        return "n/a (CPU)"
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            ours(engine, taken)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    ) as profile:
        ours(engine, taken)
    totals = profile.key_averages()
    cpu = sum(e.self_cpu_time_total for e in totals) / 1000
    cuda = sum(getattr(e, "self_device_time_total", 0) for e in totals) / 1000
    return f"{len(seen)} GPU waits; CPU {cpu:.1f} ms, CUDA {cuda:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--checkpoint", help="a Qwen3-ASR directory (default: the tiny one)")
    parser.add_argument("--rows", default="1,32")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    checkpoint = args.checkpoint or str(tiny_qwen())
    sizes = [int(n) for n in args.rows.split(",")]
    engine = QwenEngine(checkpoint, device=args.device, decode="steps", rows=max(sizes),
                        kv_tokens=1024)  # fmt: skip
    started = time.perf_counter()
    engine.load()
    print(f"{checkpoint} on {engine.device} ({engine.dtype}); loaded in "
          f"{time.perf_counter() - started:.1f} s")  # fmt: skip
    for size in sizes:
        taken = rows(engine, size, args.seconds)
        ours(engine, taken)
        sdk(engine, taken)  # warm both
        mine = statistics.median(ours(engine, taken) for _ in range(args.repeat))
        theirs = statistics.median(sdk(engine, taken) for _ in range(args.repeat))
        host = statistics.median(processor_time(engine, taken) for _ in range(args.repeat))
        events, reads = counts(engine, taken)
        print(f"{size:>3} x {args.seconds:g} s: ours {mine * 1000:8.1f} ms | sdk forward "
              f"{theirs * 1000:8.1f} ms | x{theirs / mine:5.2f} | processor (host) "
              f"{host * 1000:7.1f} ms | {events} profiler events, {reads} host reads | "
              f"{waits(engine, taken)}")  # fmt: skip
    steady = statistics.median(ours(engine, rows(engine, 1, 12.3)) for _ in range(1))
    fresh = ours(engine, rows(engine, 1, 17.7))  # a length never seen before
    again = statistics.median(ours(engine, rows(engine, 1, 17.7)) for _ in range(3))
    print(f"first call of a new length: {fresh * 1000:.1f} ms, then {again * 1000:.1f} ms "
          f"(extra {(fresh - again) * 1000:.1f} ms; 12.3 s: {steady * 1000:.1f} ms)")  # fmt: skip
    engine.unload()


if __name__ == "__main__":
    main()
