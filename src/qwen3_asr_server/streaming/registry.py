"""Bounded set of live streaming sessions (limit on connect, finals on shutdown). A
multichannel stream (`channels.ChannelGroup`) takes one seat per channel."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from loguru import logger

Drain = Callable[[], Awaitable[None]]


class Live(Protocol):
    """A StreamSession, or a ChannelGroup of them."""

    @property
    def channels(self) -> int: ...
    @property
    def lag(self) -> float: ...
    @property
    def pending_seconds(self) -> float: ...
    async def close(self, reason: str) -> None: ...


class SessionLimitError(Exception):
    pass


class SessionRegistry:
    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self._sessions: dict[Live, Drain | None] = {}
        self.closing = False  # the server is shutting down: no new sessions

    def __len__(self) -> int:
        """Seats taken: one per channel of every live session."""
        return sum(s.channels for s in self._sessions)

    @property
    def streams(self) -> int:
        """Live streams: one per session, whatever its channels (a stereo call is one)."""
        return len(self._sessions)

    def add(self, session: Live, drain: Drain | None = None) -> None:
        """`drain` waits until the session's events have reached its client."""
        if self.closing:
            raise SessionLimitError("The server is shutting down; reconnect shortly.")
        if len(self) + session.channels > self.max_sessions:
            each = " (each channel counts)" if session.channels > 1 else ""
            raise SessionLimitError(
                f"Too many streaming sessions ({self.max_sessions}, WS_MAX_SESSIONS{each}); "
                "retry later."
            )
        self._sessions[session] = drain

    def lag(self) -> tuple[float, float]:
        """The largest lag of a live session (`StreamSession.lag`), and the seconds of audio
        committed and waiting for finals over all sessions (read by /metrics)."""
        sessions = list(self._sessions)
        most = max((s.lag for s in sessions), default=0.0)
        return most, sum(s.pending_seconds for s in sessions)

    def remove(self, session: Live) -> None:
        self._sessions.pop(session, None)

    async def close_all(self) -> None:
        """Server shutdown: every open utterance gets its final."""
        self.closing = True
        sessions = list(self._sessions.items())
        if sessions:
            logger.info("finalizing {} streaming sessions", len(sessions))

        async def finish(session: Live, drain: Drain | None) -> None:
            await session.close("shutdown")
            if drain is not None:
                await drain()

        await asyncio.gather(*(finish(s, d) for s, d in sessions), return_exceptions=True)
