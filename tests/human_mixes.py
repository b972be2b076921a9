"""Mixes of real human read speech for live speakers (issue 58): turns of 3 or 5 people from
tests/data/human (FLEURS clips, see its README), 0.7 s of silence between turns. Used by
tests/test_live_speakers_human.py and bench/live_speakers.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf

HUMAN = Path(__file__).parent / "data" / "human"
RATE = 16000
GAP_S = 0.7
# each person's two turns (<name>_1, <name>_2), in the order they are spoken
MIXES = {
    "human3": ["cantonese_1", "thai_1", "japanese_1", "cantonese_2", "thai_2", "japanese_2"],
    "human5": [
        "cantonese_1",
        "thai_1",
        "japanese_1",
        "hindi_1",
        "chinese_1",
        "japanese_2",
        "cantonese_2",
        "chinese_2",
        "thai_2",
        "hindi_2",
    ],
}


def turn(name: str) -> np.ndarray:
    audio, rate = sf.read(HUMAN / f"{name}.flac", dtype="float32")
    assert rate == RATE, rate
    return audio


def human_mix(name: str) -> tuple[np.ndarray, list[tuple[str, float, float]]]:
    """The mix's audio (16 kHz mono, 0.7 s of silence after each turn) and its true turns
    (speaker, start s, end s)."""
    gap = np.zeros(int(GAP_S * RATE), np.float32)
    parts, truth, at = [], [], 0
    for piece in MIXES[name]:
        audio = turn(piece)
        truth.append((piece.rsplit("_", 1)[0], at / RATE, (at + len(audio)) / RATE))
        parts += [audio, gap]
        at += len(audio) + len(gap)
    return np.concatenate(parts), truth
