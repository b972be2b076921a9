"""A multichannel live stream (issue 44): one StreamSession per channel, so each channel has
its own voice detection, utterances, partials and finals. The transport feeds interleaved
audio as (samples, channels) frames at 16 kHz; every channel gets its own column, fed to
all channels at once so their voice detection shares the VAD batcher's calls. A channel's
faint copy of another (line echo) is silenced first (`audio.channels.EchoGate`), so it does
not open utterances on the wrong channel.

A group counts as one seat per channel in the session registry (WS_MAX_SESSIONS), and its
back-pressure is each channel's: a feed waits until every channel has room."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..audio.channels import EchoGate
from .session import StreamSession


@dataclass(eq=False)
class ChannelGroup:
    sessions: list[StreamSession]
    gate: EchoGate = field(init=False)

    def __post_init__(self) -> None:
        self.gate = EchoGate(len(self.sessions))
        # feed, release and close take the gate in turn (a shutdown's close may come while
        # the receive loop feeds): no audio twice, none out of order
        self._turn = asyncio.Lock()
        self._closing: asyncio.Future[None] | None = None

    @property
    def channels(self) -> int:
        return len(self.sessions)

    @property
    def samples_in(self) -> int:
        """Audio received per channel, in samples (every channel gets the same)."""
        return self.sessions[0].samples_in

    @property
    def client_gone(self) -> bool:
        return any(s.client_gone for s in self.sessions)

    @property
    def lag(self) -> float:
        return max(s.lag for s in self.sessions)

    @property
    def pending_seconds(self) -> float:
        return sum(s.pending_seconds for s in self.sessions)

    async def feed(self, samples: np.ndarray) -> None:
        """(n, channels) float32 at 16 kHz: column c, echo gated, to channel c's session
        (whole 20 ms frames; the rest waits for the next message or `release`). The gate
        runs off the event loop: ~0.3 ms per 100 ms message when one side speaks."""
        async with self._turn:
            await self._give(await asyncio.to_thread(self.gate.push, samples))

    async def release(self) -> None:
        """Pass on the samples the echo gate holds (before a flush, reset or close)."""
        async with self._turn:
            await self._give(self.gate.rest())

    async def _give(self, samples: np.ndarray) -> None:
        if len(samples):
            await asyncio.gather(
                *(s.feed(np.ascontiguousarray(samples[:, c])) for c, s in enumerate(self.sessions))
            )

    def client_left(self) -> None:
        """A feed waiting for room goes on (see StreamSession.client_left)."""
        for session in self.sessions:
            session.client_left()

    def configure(self, **changes: Any) -> None:
        for session in self.sessions:
            session.configure(**changes)

    async def close(self, reason: str) -> None:
        """Every channel's buffered audio gets its final (see StreamSession.close). Safe to
        call from two places at once (a disconnect and the server's shutdown)."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close(reason))
        closing = self._closing
        await asyncio.wait([closing])  # (returns, not raises, once it is abandoned)
        if not closing.cancelled() and (error := closing.exception()) is not None:
            raise error

    async def _close(self, reason: str) -> None:
        await self.release()
        await asyncio.gather(*(s.close(reason) for s in self.sessions))

    def abandon(self) -> tuple[int, float]:
        """Stop every channel now (see StreamSession.abandon): the finals not emitted and the
        seconds of audio in them, all channels together."""
        lost = [s.abandon() for s in self.sessions]
        if self._closing is not None:
            self._closing.cancel()
        return sum(n for n, _ in lost), sum(seconds for _, seconds in lost)
