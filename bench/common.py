"""Shared helpers for the benchmark scripts (run from the repo root)."""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# The benchmarks reuse the tests' helpers (server process, audio, fixtures).
for extra in (ROOT / "tests", ROOT / "scripts", ROOT / "E2Etest"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))


def tiny_qwen(path: str | None = None) -> Path:
    """Build (or reuse) the tiny random-weight Qwen3-ASR checkpoint used by the tests."""
    from tiny_qwen import build

    target = Path(path or Path(tempfile.gettempdir()) / "qwen3-asr-bench-tiny")
    if not (target / "model.safetensors").exists():
        build(target)
    return target


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary(values: list[float], unit: str = "ms", scale: float = 1000.0) -> str:
    return (
        f"p50 {pct(values, 50) * scale:.1f} {unit}, p95 {pct(values, 95) * scale:.1f} {unit}, "
        f"mean {statistics.mean(values) * scale:.1f} {unit} (n={len(values)})"
    )


def parse_server_timing(header: str) -> dict[str, float]:
    """`decode;dur=1.2, engine;dur=3.4` -> seconds per part."""
    out: dict[str, float] = {}
    for part in header.split(","):
        name, _, dur = part.strip().partition(";dur=")
        out[name] = float(dur) / 1000
    return out


def sentence_track(
    names: list[str], tail_s: float, rate: int = 16000
) -> tuple[np.ndarray, list[float]]:
    """The espeak-ng sentences `names` (tests/data/speech) one after another, each followed
    by `tail_s` of silence, and where each one's speech ends in the track (seconds): its last
    sample above 0.02, as bench/streaming.py measures."""
    from streaming_client import load

    pieces, ends, at = [], [], 0.0
    for name in names:
        audio = load(name)
        loud = np.flatnonzero(np.abs(audio) > 0.02)
        ends.append(at + (loud[-1] + 1) / rate)
        pieces += [audio, np.zeros(int(tail_s * rate), np.float32)]
        at += len(audio) / rate + tail_s
    return np.concatenate(pieces), ends
