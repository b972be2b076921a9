"""The open utterance's audio buffer of a streaming session."""

from __future__ import annotations

import numpy as np

from ..audio.pcm import SAMPLE_RATE, quietest_point


class Utterance:
    """The open utterance's audio, bounded by max_utterance_s (forced final)."""

    def __init__(self, utterance_id: int, capacity: int, start_sample: int) -> None:
        self.id = utterance_id
        self.buf = np.zeros(capacity, dtype=np.float32)
        self.length = 0
        self.start_sample = start_sample
        self.partials = 0  # partials sent for this utterance
        self.shown = ("", "")  # the last partial's text and stable text

    def add(self, samples: np.ndarray) -> None:
        self.buf[self.length : self.length + len(samples)] = samples
        self.length += len(samples)

    @property
    def audio(self) -> np.ndarray:
        return self.buf[: self.length]

    def tail(self, seconds: float) -> np.ndarray:
        """A copy of the last `seconds`. Safe from another thread while the event loop
        appends: samples below `length` are written before `length` moves."""
        end = self.length
        return self.buf[max(0, end - int(seconds * SAMPLE_RATE)) : end].copy()

    def quietest_cut(self, seconds: float) -> int:
        """Sample index of the quietest point in the last `seconds` (at most half the
        utterance): where a final at maximum length cuts."""
        search = min(self.length // 2, int(seconds * SAMPLE_RATE))
        return self.length - search + quietest_point(self.audio[self.length - search :])
