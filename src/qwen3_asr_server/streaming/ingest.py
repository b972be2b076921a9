"""Audio ingest for both WebSocket protocols: s16le PCM, or G.711 μ-law / A-law bytes (8 kHz
telephony audio), at the client's rate -> 16 kHz float32 -> the session, within the
session's audio limit (WS_MAX_SESSION_S). G.711 is decoded with a table (`audio/g711.py`), then
resampled like any 8 kHz PCM.

A multichannel stream (`channels` > 1) sends interleaved frames (FreeSWITCH's stereo audio
fork: left, right, left, ...); they come out as (samples, channels) arrays, resampled
together, for a `ChannelGroup`, or, with `mix`, averaged into one mono session (Deepgram's
`channels` without `multichannel`).

A byte stream may be cut anywhere: the bytes of a frame not yet complete (the first byte of
an s16le sample, or the first channels of a frame) wait for the next message, so every later
sample stays aligned. The resampler holds a few ms of audio
between messages; `drain` (flush, commit, reset, close) passes them on, so they are part of
the item they were sent in, and a change of rate passes on the old rate's tail first.

Decoding and resampling a large message runs on a thread, as voice detection does (1 MiB of
G.711 took 30-70 ms on the event loop); one message at a time per stream, so frames keep
their order and the odd bytes their place. A conversion whose feed was cancelled runs on;
the event loop waits for it before it touches the state again (it never blocks on the
lock). A message of at most INLINE_BYTES costs less than the hop to a thread (~0.3 ms) and
is converted where it arrives."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, Literal, Protocol

import numpy as np
import soxr

from ..audio import g711
from ..audio.decode import pcm16_to_float
from ..audio.pcm import SAMPLE_RATE

Encoding = Literal["pcm_s16le", "mulaw", "alaw"]
G711_RATE = g711.RATE
INLINE_BYTES = 8192  # 1 s of 8 kHz G.711, 0.25 s of 16 kHz PCM


class Fed(Protocol):
    """A StreamSession (mono audio), or a ChannelGroup ((samples, channels) audio)."""

    @property
    def samples_in(self) -> int: ...
    async def feed(self, samples: np.ndarray) -> None: ...


class PcmIngest:
    def __init__(
        self,
        rate: int,
        max_seconds: float,
        encoding: Encoding = "pcm_s16le",
        channels: int = 1,
        mix: bool = False,
    ) -> None:
        self.rate = 0  # set below
        self.mix = mix  # the channels averaged into one (a mono session)
        self.encoding: Encoding = encoding
        self.channels = channels
        self._empty = np.zeros((0, channels) if channels > 1 else 0, dtype=np.float32)
        self._resampler: Any = None
        self._odd = b""  # the bytes of a frame whose other bytes have not come yet
        self._tail = self._empty  # 16 kHz audio a previous rate's resampler still held
        # The conversion may run on a thread: whatever touches the resampler, the odd bytes
        # or the tail holds this (uncontended: one stream's messages come one at a time).
        self._lock = threading.Lock()
        # Work off the event loop not yet done: a conversion on its thread, which goes on
        # when the feed awaiting it is cancelled (a session torn down), and what was asked
        # after it. The event loop takes the lock only once this is done, never waits on it.
        self._busy: asyncio.Future[Any] | None = None
        self.max_samples = int(max_seconds * SAMPLE_RATE)
        self.set_rate(rate)

    def set_rate(self, rate: int, encoding: Encoding | None = None) -> None:
        """The client's sample rate (and encoding); a change of rate starts a new
        resampler, after taking what the old one held."""
        self._after_busy(lambda: self._set_rate(rate, encoding))

    def set_channels(self, channels: int, mix: bool) -> None:
        """Before any audio (a WAV header read from a live stream's first bytes): how many
        channels its frames have, and whether they are mixed into one."""
        with self._lock:
            self.channels, self.mix = channels, mix
            self._empty = self._tail = np.zeros((0, channels) if channels > 1 else 0, np.float32)
            self._resampler = None if self.rate == SAMPLE_RATE else self._new_resampler()

    def _set_rate(self, rate: int, encoding: Encoding | None) -> None:
        with self._lock:
            if encoding is not None and encoding != self.encoding:
                self.encoding = encoding
                self._odd = b""  # half a sample of the old encoding means nothing in the new
            if rate != self.rate:
                self._tail = np.concatenate([self._tail, self._held()])
                self.rate = rate
                self._resampler = None if rate == SAMPLE_RATE else self._new_resampler()

    def _new_resampler(self) -> Any:
        return soxr.ResampleStream(self.rate, SAMPLE_RATE, self.channels, dtype="float32")

    def _held(self) -> np.ndarray:
        """What the resampler still holds, as 16 kHz audio; it starts afresh."""
        if self._resampler is None:
            return self._empty
        held: np.ndarray = self._resampler.resample_chunk(self._empty, last=True)
        self._resampler = self._new_resampler()
        return held

    def decode(self, data: bytes) -> np.ndarray:
        """Bytes -> float32 at the client's rate, (samples, channels) when there are several;
        the bytes of an incomplete frame wait for the next message."""
        law = self.encoding
        frame = (1 if law != "pcm_s16le" else 2) * self.channels
        if frame > 1 or self._odd:
            data = self._odd + data
            cut = len(data) - len(data) % frame
            data, self._odd = data[:cut], data[cut:]
        samples = pcm16_to_float(data) if law == "pcm_s16le" else g711.decode(data, law)
        return samples.reshape(-1, self.channels) if self.channels > 1 else samples

    async def feed(self, session: Fed, data: bytes) -> bool:
        """Decode, resample and feed `data`. False, and nothing fed, when it would take the
        session past its audio limit."""
        await self._settled()
        if len(data) <= INLINE_BYTES:
            samples = self._convert(data)
        else:  # off the event loop (the caller awaits it: the next message waits its turn)
            converting = self._busy = asyncio.ensure_future(asyncio.to_thread(self._convert, data))
            samples = await asyncio.shield(converting)  # (cancelled: it runs on; `_busy` says)
        return await self._give(session, samples)

    async def _settled(self) -> None:
        """Wait until the work off the event loop is done (it holds the lock meanwhile)."""
        while (busy := self._busy) is not None and not busy.done():
            await asyncio.wait([busy])  # (its failure was its feed's)

    def _after_busy(self, work: Callable[[], None]) -> None:
        """Do `work` under the lock now, or, while a conversion still runs on its thread,
        as soon as it is done (in order with any later feed or drain, which wait for it)."""
        busy = self._busy
        if busy is None or busy.done():
            work()
            return

        async def then() -> None:
            await asyncio.wait([busy])
            work()

        self._busy = asyncio.ensure_future(then())

    def _convert(self, data: bytes) -> np.ndarray:
        """Decode and resample `data`, after what a previous rate's resampler held."""
        with self._lock:
            samples = self.decode(data)
            if self._resampler is not None:
                samples = self._resampler.resample_chunk(samples)
            if len(self._tail):
                samples, self._tail = np.concatenate([self._tail, samples]), self._empty
            return samples

    async def drain(self, session: Fed) -> None:
        """Pass on what the resampler holds (before a flush, commit, reset or close). A
        half sample still waiting for its second byte stays: it belongs to the next one."""
        await self._settled()
        with self._lock:  # (a few ms of audio: the filter's delay)
            samples, self._tail = np.concatenate([self._tail, self._held()]), self._empty
        if len(samples):
            await self._give(session, samples)

    def clear(self) -> None:
        """Drop what is held (the client discarded its buffer)."""
        self._after_busy(self._clear)

    def _clear(self) -> None:
        with self._lock:
            self._tail, self._odd = self._empty, b""
            if self._resampler is not None:
                self._resampler = self._new_resampler()

    async def _give(self, session: Fed, samples: np.ndarray) -> bool:
        if self.mix and samples.ndim == 2:
            samples = samples.mean(axis=1, dtype=np.float32)
        if session.samples_in + len(samples) > self.max_samples:
            return False
        await session.feed(samples)
        return True
