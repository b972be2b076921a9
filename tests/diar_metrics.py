"""Diarization scores against ground-truth turns, on a 10 ms grid: confusion (speech time
given to the wrong speaker after the best speaker mapping) and DER (missed speech + false
alarm + confusion) with a collar around each true turn boundary that is not scored, the
overlap of two true speakers not scored either."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import permutations
from typing import Any

import numpy as np

STEP = 0.01


def _grid(turns: Sequence[Any], length: int, key: Any) -> np.ndarray:
    """-1: nobody; -2: more than one speaker; else the speaker's index in `key`."""
    grid = np.full(length, -1, dtype=np.int64)
    for speaker, start, end in turns:
        a, b = int(start / STEP), min(length, int(end / STEP))
        index = key.index(speaker)
        span = grid[a:b]
        span[(span != -1) & (span != index)] = -2
        span[span == -1] = index
    return grid


def scores(
    truth: Sequence[tuple[str, float, float]],
    hypothesis: Sequence[tuple[str, float, float]],
    collar: float = 0.25,
) -> dict[str, float]:
    end = max([e for _, _, e in truth] + [e for _, _, e in hypothesis] + [0.0])
    length = int(end / STEP) + 1
    true_names = sorted({s for s, _, _ in truth})
    hyp_names = sorted({s for s, _, _ in hypothesis})
    ref = _grid(truth, length, true_names)
    hyp = _grid(hypothesis, length, hyp_names)
    scored = ref != -2
    for _, start, stop in truth:  # the collar around every true boundary
        for t in (start, stop):
            scored[max(0, int((t - collar) / STEP)) : int((t + collar) / STEP)] = False
    speech = scored & (ref >= 0)
    best = 0
    # the mapping of hypothesis speakers to true ones that agrees most (few speakers here)
    names = list(range(len(true_names)))
    hyp_ids = list(range(len(hyp_names)))
    pad = max(len(hyp_ids), len(names))
    for perm in permutations(list(range(pad)), len(hyp_ids)):
        agree = sum(
            int(np.sum(speech & (hyp == h) & (ref == perm[h])))
            for h in hyp_ids
            if perm[h] < len(names)
        )
        best = max(best, agree)
    total = int(np.sum(speech))
    detected = speech & (hyp >= 0)
    confusion = int(np.sum(detected)) - best
    missed = int(np.sum(speech & (hyp < 0)))
    false_alarm = int(np.sum(scored & (ref == -1) & (hyp >= 0)))
    return {
        "speakers": float(len(hyp_names)),
        "confusion": confusion / max(1, total),
        "der": (confusion + missed + false_alarm) / max(1, total),
        "missed": missed / max(1, total),
        "false_alarm": false_alarm / max(1, total),
    }
