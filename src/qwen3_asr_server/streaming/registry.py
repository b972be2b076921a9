"""Bounded set of live streaming sessions (limit on connect, finals on shutdown)."""

from __future__ import annotations

import asyncio

from loguru import logger

from .session import StreamSession


class SessionLimitError(Exception):
    pass


class SessionRegistry:
    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self._sessions: set[StreamSession] = set()

    def __len__(self) -> int:
        return len(self._sessions)

    def add(self, session: StreamSession) -> None:
        if len(self._sessions) >= self.max_sessions:
            raise SessionLimitError(
                f"Too many streaming sessions ({self.max_sessions}, WS_MAX_SESSIONS); retry later."
            )
        self._sessions.add(session)

    def remove(self, session: StreamSession) -> None:
        self._sessions.discard(session)

    async def close_all(self) -> None:
        """Server shutdown: every open utterance gets its final."""
        sessions = list(self._sessions)
        if sessions:
            logger.info("finalizing {} streaming sessions", len(sessions))
        await asyncio.gather(*(s.close("shutdown") for s in sessions), return_exceptions=True)
