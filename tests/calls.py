"""A two-sided call for the multichannel tests (issue 44): one speaker per channel, built
from the repo's voices (espeak-ng sentences)."""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf

from streaming_client import load

RATE = 16000
AGENT = ["sentence_01.wav", "sentence_03.wav"]
CUSTOMER = ["sentence_02.wav", "sentence_04.wav"]
NAMES = ["agent", "customer"]


def call_tracks(echo_db: float | None = None) -> tuple[np.ndarray, list[float]]:
    """A stereo call: agent, customer (starting 0.4 s before the agent ends), agent,
    customer; with `echo_db`, each side's copy that much quieter on the other channel.
    Returns (2, samples) float32 tracks and each turn's start (s)."""
    turns = [(0, AGENT[0]), (1, CUSTOMER[0]), (0, AGENT[1]), (1, CUSTOMER[1])]
    clips = [(ch, load(name)) for ch, name in turns]
    starts, at = [], 0.5
    for i, (_, clip) in enumerate(clips):
        starts.append(at)
        overlap = 0.4 if i == 0 else -0.8  # the customer cuts in; then pauses between turns
        at += len(clip) / RATE - overlap
    total = int((at + 1.5) * RATE)
    tracks = np.zeros((2, total), np.float32)
    for (ch, clip), start in zip(clips, starts, strict=True):
        s = int(start * RATE)
        tracks[ch, s : s + len(clip)] += clip
    if echo_db is not None:
        gain = 10 ** (-echo_db / 20)
        tracks = tracks + gain * tracks[::-1]
    return tracks, starts


def call(echo_db: float | None = None) -> tuple[bytes, list[float]]:
    """call_tracks as a stereo 16-bit WAV file."""
    tracks, starts = call_tracks(echo_db)
    buf = io.BytesIO()
    sf.write(buf, tracks.T, RATE, format="WAV", subtype="PCM_16")
    return buf.getvalue(), starts
