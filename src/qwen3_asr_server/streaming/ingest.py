"""Audio ingest for both WebSocket protocols: s16le PCM, or G.711 μ-law / A-law bytes (8 kHz
telephony audio), at the client's rate -> 16 kHz float32 -> the session, within the
session's audio limit (WS_MAX_SESSION_S). G.711 is decoded with a table (`g711.py`), then
resampled like any 8 kHz PCM."""

from __future__ import annotations

from typing import Any, Literal

import soxr

from .. import g711
from ..audio import pcm16_to_float
from ..pcm import SAMPLE_RATE
from .session import StreamSession

Encoding = Literal["pcm_s16le", "mulaw", "alaw"]
G711_RATE = 8000


class PcmIngest:
    def __init__(self, rate: int, max_seconds: float, encoding: Encoding = "pcm_s16le") -> None:
        self.rate = 0  # set below
        self.encoding: Encoding = encoding
        self._resampler: Any = None
        self.max_samples = int(max_seconds * SAMPLE_RATE)
        self.set_rate(rate)

    def set_rate(self, rate: int, encoding: Encoding | None = None) -> None:
        """The client's sample rate (and encoding); a change of rate starts a new
        resampler."""
        if encoding is not None:
            self.encoding = encoding
        if rate != self.rate:
            self.rate = rate
            self._resampler = (
                None
                if rate == SAMPLE_RATE
                else soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32")
            )

    async def feed(self, session: StreamSession, data: bytes) -> bool:
        """Decode, resample and feed `data`. False, and nothing fed, when it would take the
        session past its audio limit."""
        if self.encoding == "pcm_s16le":
            samples = pcm16_to_float(data)
        else:
            samples = g711.decode(data, self.encoding)
        if self._resampler is not None:
            samples = self._resampler.resample_chunk(samples)
        if session.samples_in + len(samples) > self.max_samples:
            return False
        await session.feed(samples)
        return True
