"""DUAL_MODEL (issue 16): first-partial latency with and without a fast model for partials.

    .venv/bin/python bench/dual_model.py [--sentences 6] [--tokens 8]

The main model is random weights of the real Qwen3-ASR-0.6B shape (scripts/tiny_qwen.py; the
real checkpoint is not on this offline machine), float32 on CPU; the fast model is the
bundled whisper tiny.en. An utterance's first partial decodes its first ~0.6 s (0.3 s of
pre-roll + 0.3 s of speech), so its latency is 0.3 s of speech + that call:

1. The partial call on each model, in process, on the first 0.6 s of each sentence. Random
   weights never emit an end token, so the Qwen call is held to `--tokens` new tokens
   (about what a real model emits for 0.3 s of speech: language tag, a word or two, end).
2. End to end with DUAL_MODEL=true: speech start -> first partial over /ws/transcribe
   (language=en) at real-time pace (bench/streaming.py's measure). Without DUAL_MODEL the
   random-weight model's partials have no text, so that side cannot be measured end to end.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from common import pct  # also puts scripts/ and tests/ on sys.path

import numpy as np

import speech
from proc import ServerProcess
from streaming import run_stream
from streaming_client import load
from tiny_qwen import build


def call_seconds(engine: object, clips: list[np.ndarray], runs: int = 3) -> list[float]:
    from qwen3_asr_server.engines.base import TranscribeRequest

    out = []
    for clip in clips:
        request = TranscribeRequest(clip, "en", draft=True, partial=True)
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            engine.transcribe(request)  # type: ignore[attr-defined]
            times.append(time.perf_counter() - started)
        out.append(statistics.median(times))
    return out


def first_partials(env: dict[str, str], names: list[str]) -> list[float]:
    server = ServerProcess({**env, "LOG_LEVEL": "WARNING", "PRELOAD": "true"})
    try:
        server.wait_healthy(timeout=120)
        time.sleep(20)  # PRELOAD of the 0.6B-shape weights
        out: dict[str, object] = {}
        run_stream(server.url, names[:1], out, language="en")  # warm-up
        out = {}
        run_stream(server.url, names, out, language="en")
    finally:
        server.stop()
    first = out["first_partial"]
    assert isinstance(first, list)
    return first


def main() -> None:
    from qwen3_asr_server.engines.qwen.engine import QwenEngine
    from qwen3_asr_server.engines.whisper.engine import WhisperEngine

    parser = argparse.ArgumentParser()
    parser.add_argument("--sentences", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=8)
    args = parser.parse_args()
    names = sorted(speech.sentences())[: args.sentences]
    clips = []
    for name in names:
        audio = load(name)
        start = int(np.flatnonzero(np.abs(audio) > 0.02)[0])
        clips.append(audio[max(0, start - 4800) : start + 4800])
    with tempfile.TemporaryDirectory() as tmp:
        model = str(build(Path(tmp) / "qwen-0.6b-shape", shape="0.6b"))
        qwen = QwenEngine(model, device="cpu", dtype="float32", max_new_tokens=args.tokens)
        qwen.load()
        whisper = WhisperEngine("whisper-tiny.en")
        whisper.load()
        qwen_s, whisper_s = call_seconds(qwen, clips), call_seconds(whisper, clips)
        qwen.unload()
        whisper.unload()
        env = {"MODEL_ID": model, "DTYPE": "float32", "MAX_NEW_TOKENS": str(args.tokens)}
        dual = first_partials(
            {**env, "DUAL_MODEL": "true", "FAST_MODEL_ID": "whisper-tiny.en"}, names
        )
    print("| metric | MODEL_ID only (0.6B-shape Qwen) | + DUAL_MODEL (whisper tiny.en) |")
    print("|---|---|---|")
    print(
        f"| first partial's call, p50 / p95 | {pct(qwen_s, 50) * 1000:.0f} / "
        f"{pct(qwen_s, 95) * 1000:.0f} ms | {pct(whisper_s, 50) * 1000:.0f} / "
        f"{pct(whisper_s, 95) * 1000:.0f} ms |"
    )
    print(
        f"| first partial after speech start (0.3 s + call), p50 | "
        f"~{(0.3 + pct(qwen_s, 50)) * 1000:.0f} ms | ~{(0.3 + pct(whisper_s, 50)) * 1000:.0f} ms |"
    )
    print(f"| measured end to end over /ws/transcribe, p50 | n/a | {pct(dual, 50) * 1000:.0f} ms |")


if __name__ == "__main__":
    main()
