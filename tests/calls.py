"""A two-sided call for the multichannel tests (issue 44): one speaker per channel, built
from the repo's voices: the turns of espeak-ng voices m3 (the agent) and f4 (the customer)
in tests/data/speech/meeting.wav that overlap no other voice (meeting.json says who spoke
when, and what; scripts/make_speech_fixtures.py --speakers)."""

from __future__ import annotations

import functools
import io
import json

import numpy as np
import soundfile as sf
import soxr

import speech

RATE = 16000
AGENT = ["meeting:0", "meeting:6"]  # voice m3
CUSTOMER = ["meeting:1", "meeting:7"]  # voice f4
NAMES = ["agent", "customer"]
MARGIN_S = 0.1  # kept around a turn; the next voice is 0.7 s away


@functools.cache
def _meeting() -> tuple[np.ndarray, list[dict[str, object]]]:
    audio, rate = sf.read(speech.path("meeting.wav"), dtype="float32")
    assert rate == RATE
    return audio, json.loads(speech.path("meeting.json").read_text())


def clip(name: str) -> np.ndarray:
    """One turn of meeting.wav, alone."""
    audio, turns = _meeting()
    turn = turns[int(name.split(":")[1])]
    start, end = float(turn["start"]) - MARGIN_S, float(turn["end"]) + MARGIN_S  # type: ignore[arg-type]
    return audio[int(start * RATE) : int(end * RATE)].copy()


def said(name: str) -> str:
    """What was said in that turn."""
    return str(_meeting()[1][int(name.split(":")[1])]["text"])


def reference(names: list[str]) -> str:
    return " ".join(said(n) for n in names)


def call_tracks(echo_db: float | None = None) -> tuple[np.ndarray, list[float]]:
    """A stereo call: agent, customer (starting 0.4 s before the agent ends), agent,
    customer; with `echo_db`, each side's copy that much quieter on the other channel.
    Returns (2, samples) float32 tracks and each turn's start (s)."""
    turns = [(0, AGENT[0]), (1, CUSTOMER[0]), (0, AGENT[1]), (1, CUSTOMER[1])]
    clips = [(ch, clip(name)) for ch, name in turns]  # (channel, audio)
    starts, at = [], 0.5
    for i, (_, audio) in enumerate(clips):
        starts.append(at)
        overlap = 0.4 if i == 0 else -0.8  # the customer cuts in; then pauses between turns
        at += len(audio) / RATE - overlap
    total = int((at + 1.5) * RATE)
    tracks = np.zeros((2, total), np.float32)
    for (ch, audio), start in zip(clips, starts, strict=True):
        s = int(start * RATE)
        tracks[ch, s : s + len(audio)] += audio
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


def sentence(number: int) -> np.ndarray:
    """tests/data/speech/sentence_NN.wav (about 0.2 s of silence at each end)."""
    audio, rate = sf.read(speech.path(f"sentence_{number:02d}.wav"), dtype="float32")
    assert rate == RATE
    return np.asarray(audio, np.float32)


def placed_call(turns: list[tuple[int, float, int]], rate: int = RATE) -> tuple[bytes, float]:
    """A stereo call from (channel, start s, sentence number) turns, 1 s of silence after
    the last: a 16-bit WAV at `rate`, and its length in seconds."""
    end = max(start + len(sentence(n)) / RATE for _, start, n in turns) + 1.0
    tracks = np.zeros((2, int(end * RATE)), np.float32)
    for channel, start, n in turns:
        at = int(start * RATE)
        tracks[channel, at : at + len(sentence(n))] += sentence(n)
    data = tracks.T if rate == RATE else soxr.resample(tracks.T, RATE, rate)
    buf = io.BytesIO()
    sf.write(buf, data, rate, format="WAV", subtype="PCM_16")
    return buf.getvalue(), end


def alternating(count: int = 10, gap_s: float = 0.5) -> list[tuple[int, float, int]]:
    """`count` turns of sentences 1, 2, ..., on channels 0, 1, 0, ..., `gap_s` apart."""
    turns, at = [], 0.5
    for i in range(count):
        turns.append((i % 2, at, i + 1))
        at += len(sentence(i + 1)) / RATE + gap_s
    return turns
