"""QUANTIZE=int8 on CPU (issue 16): PyTorch dynamic int8 quantization of the Qwen decoder's
linear layers against float32, on random weights of the real Qwen3-ASR-0.6B shape.

    .venv/bin/python bench/quantize.py [--tokens 33] [--runs 3]

Measures RSS after load, the time of a call generating 1 token (audio encoder + prefill) and
of one generating `--tokens` (ms per token = the difference / (tokens - 1)), and how many
output tokens agree with float32 on the same inputs (greedy).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import pct  # noqa: F401  (puts scripts/ and tests/ on sys.path)

from streaming_client import load


def rss_mb() -> float:
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # give freed heap back first: RSS = what is held
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def weight_mb(network: object) -> float:
    """Bytes of every parameter and buffer, int8 packed weights included, tied ones once."""
    import torch

    seen, total = set(), 0
    for value in network.state_dict().values():  # type: ignore[attr-defined]
        tensors = value if isinstance(value, tuple) else (value,)
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor) and tensor.data_ptr() not in seen:
                seen.add(tensor.data_ptr())
                total += tensor.element_size() * tensor.nelement()
    return total / 2**20


def timed(engine: object, audio: object, runs: int) -> tuple[float, str]:
    from qwen3_asr_server.engines.base import TranscribeRequest

    times, text = [], ""
    for _ in range(runs):
        started = time.perf_counter()
        text = engine.transcribe(TranscribeRequest(audio, "en")).text  # type: ignore[attr-defined]
        times.append(time.perf_counter() - started)
    return statistics.median(times), text


def run_mode(model: str, mode: str, tokens: int, runs: int) -> dict[str, object]:
    """One precision in this process: RSS of the loaded model, timings, output token ids."""
    from qwen3_asr_server.engines.qwen.engine import QwenEngine

    clips = [load(name) for name in ("sentence_01.wav", "sentence_02.wav", "sentence_03.wav")]
    base = rss_mb()
    engine = QwenEngine(
        model, device="cpu", dtype="float32", quantize="int8" if mode == "int8" else None
    )
    engine.load()
    loaded = rss_mb() - base
    weights = weight_mb(engine._model.model)
    engine._max_new_tokens = 1  # the per-call token budget reads it
    one = [timed(engine, clip, runs)[0] for clip in clips]
    engine._max_new_tokens = tokens
    network = engine._model.model
    generate, generated = network.generate, []

    def capture(*args: object, **kwargs: object) -> object:
        """The generated token ids of each call (the SDK's text may hide them)."""
        out = generate(*args, **kwargs)
        sequences = getattr(out, "sequences", out)
        prompt = kwargs["input_ids"].shape[1]  # type: ignore[attr-defined]
        generated.append(sequences[0, prompt:].tolist())
        return out

    network.generate = capture
    many, ids = [], []
    for clip in clips:
        many.append(timed(engine, clip, runs)[0])
        ids.append(generated[-1])
    per_token = [(m - o) / (tokens - 1) for m, o in zip(many, one, strict=True)]
    return {
        "rss": loaded,
        "weights": weights,
        "first": statistics.median(one),
        "per_token": statistics.median(per_token),
        "ids": ids,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=33)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--mode", choices=["float32", "int8"])
    parser.add_argument("--model")
    args = parser.parse_args()
    if args.mode:  # a child: one precision, JSON on stdout
        print(json.dumps(run_mode(args.model, args.mode, args.tokens, args.runs)))
        return
    from tiny_qwen import build

    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = str(build(Path(tmp) / "qwen-0.6b-shape", shape="0.6b"))
        for mode in ("float32", "int8"):
            command = [sys.executable, __file__, "--mode", mode, "--model", model]
            command += ["--tokens", str(args.tokens), "--runs", str(args.runs)]
            out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
            rows[mode] = json.loads(out.strip().splitlines()[-1])
    f, q = rows["float32"], rows["int8"]
    same = total = 0
    for a, b in zip(f["ids"], q["ids"], strict=True):
        total += max(len(a), len(b))
        same += sum(x == y for x, y in zip(a, b, strict=False))
    print("| metric | float32 | int8 (dynamic, decoder linears) | ratio |")
    print("|---|---|---|---|")
    print(
        f"| RSS of the loaded model | {f['rss']:.0f} MB | {q['rss']:.0f} MB | "
        f"{q['rss'] / f['rss']:.2f} |"
    )
    print(
        f"| weights in memory | {f['weights']:.0f} MB | {q['weights']:.0f} MB | "
        f"{q['weights'] / f['weights']:.2f} |"
    )
    print(
        f"| encoder + prefill (1-token call), p50 | {f['first'] * 1000:.0f} ms | "
        f"{q['first'] * 1000:.0f} ms | {q['first'] / f['first']:.2f} |"
    )
    print(
        f"| decoder, ms per token | {f['per_token'] * 1000:.1f} | {q['per_token'] * 1000:.1f} | "
        f"{q['per_token'] / f['per_token']:.2f} |"
    )
    print(f"| output tokens equal to float32 | | {same}/{total} ({same / max(total, 1):.0%}) | |")


if __name__ == "__main__":
    main()
