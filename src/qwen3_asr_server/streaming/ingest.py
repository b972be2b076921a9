"""PCM ingest for both WebSocket protocols: s16le at the client's rate -> 16 kHz float32
-> the session, within the session's audio limit (WS_MAX_SESSION_S)."""

from __future__ import annotations

from typing import Any

import soxr

from ..audio import pcm16_to_float
from ..pcm import SAMPLE_RATE
from .session import StreamSession


class PcmIngest:
    def __init__(self, rate: int, max_seconds: float) -> None:
        self.rate = 0  # set below
        self._resampler: Any = None
        self.max_samples = int(max_seconds * SAMPLE_RATE)
        self.set_rate(rate)

    def set_rate(self, rate: int) -> None:
        """The client's sample rate; a change starts a new resampler."""
        if rate != self.rate:
            self.rate = rate
            self._resampler = (
                None
                if rate == SAMPLE_RATE
                else soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32")
            )

    async def feed(self, session: StreamSession, pcm: bytes) -> bool:
        """Decode, resample and feed `pcm`. False, and nothing fed, when it would take the
        session past its audio limit."""
        samples = pcm16_to_float(pcm)
        if self._resampler is not None:
            samples = self._resampler.resample_chunk(samples)
        if session.samples_in + len(samples) > self.max_samples:
            return False
        await session.feed(samples)
        return True
