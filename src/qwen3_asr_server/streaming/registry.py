"""Bounded set of live streaming sessions (limit on connect, finals on shutdown). A
multichannel stream (`channels.ChannelGroup`) takes one seat per channel.

A session whose client has left gives its seat back at once (`leave`) while its remaining
finals run (joined into a few: `Finals.merge`); as many channels of such sessions as there
are seats may run at once, and one beyond keeps its seat until its finals are done. A
shutdown waits for every session's finals at most SHUTDOWN_TIMEOUT seconds, or until a
second signal; then it stops them and logs what was not transcribed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from loguru import logger

Drain = Callable[[], Awaitable[None]]
Force = asyncio.Event | None  # set: stop waiting now


class Live(Protocol):
    """A StreamSession, or a ChannelGroup of them."""

    @property
    def channels(self) -> int: ...
    @property
    def lag(self) -> float: ...
    @property
    def pending_seconds(self) -> float: ...
    async def close(self, reason: str) -> None: ...
    def abandon(self) -> tuple[int, float]: ...


class SessionLimitError(Exception):
    pass


class SessionRegistry:
    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self._sessions: dict[Live, Drain | None] = {}  # seated
        self._gone: set[Live] = set()  # their clients have left; finals still running
        self._routes: dict[Live, str] = {}  # each session's route (metrics' `route` label)
        self.closing = False  # the server is shutting down: no new sessions

    def __len__(self) -> int:
        """Seats taken: one per channel of every live session."""
        return sum(s.channels for s in self._sessions)

    def by_route(self) -> dict[str, tuple[int, int]]:
        """Live streams (a stereo call is one) and the seats they take, by route; summed
        over routes: every live stream, and `len`."""
        counts: dict[str, tuple[int, int]] = {}
        for session in self._sessions:
            streams, seats = counts.get(self._routes[session], (0, 0))
            counts[self._routes[session]] = (streams + 1, seats + session.channels)
        return counts

    def add(self, session: Live, drain: Drain | None = None, route: str = "") -> None:
        """`drain` waits until the session's events have reached its client; `route` is the
        endpoint it came by (`/ws/transcribe`, `/v1/realtime`, `/v1/listen`)."""
        if self.closing:
            raise SessionLimitError("The server is shutting down; reconnect shortly.")
        if len(self) + session.channels > self.max_sessions:
            each = " (each channel counts)" if session.channels > 1 else ""
            raise SessionLimitError(
                f"Too many streaming sessions ({self.max_sessions}, WS_MAX_SESSIONS{each}); "
                "retry later."
            )
        self._sessions[session] = drain
        self._routes[session] = route

    def leave(self, session: Live) -> None:
        """Its client has left: the seat is free for another while its finals run, unless
        as many channels as there are seats are already finishing so."""
        if session not in self._sessions:
            return
        if sum(s.channels for s in self._gone) + session.channels > self.max_sessions:
            logger.info("client gone; its seat is held until its finals are done")
            return
        del self._sessions[session]
        self._gone.add(session)
        logger.info(
            "client gone; seat released, {:.1f} s of its audio still to transcribe",
            session.pending_seconds,
        )

    def lag(self) -> tuple[float, float]:
        """The largest lag of a live session (`StreamSession.lag`), and the seconds of audio
        committed and waiting for finals over all sessions, those of clients that left
        included (read by /metrics)."""
        most = max((s.lag for s in self._sessions), default=0.0)
        return most, sum(s.pending_seconds for s in [*self._sessions, *self._gone])

    def remove(self, session: Live) -> None:
        self._sessions.pop(session, None)
        self._gone.discard(session)
        self._routes.pop(session, None)

    async def close_all(self, timeout: float | None = None, force: Force = None) -> None:
        """Server shutdown: every open utterance gets its final, for at most `timeout`
        seconds or until `force` is set (a second signal); then the sessions still
        transcribing are stopped, and what they did not transcribe (queued finals and the
        open utterance) is logged. A timeout of 0 stops them all at once."""
        self.closing = True
        sessions = [*self._sessions.items(), *((s, None) for s in self._gone)]
        if not sessions:
            return
        logger.info("finalizing {} streaming sessions", len(sessions))

        async def finish(session: Live, drain: Drain | None) -> None:
            await session.close("shutdown")
            if drain is not None:
                await drain()

        # a timeout of 0: no wait at all, every session is stopped as it is
        stop_now = timeout is not None and timeout <= 0
        tasks = {} if stop_now else {asyncio.ensure_future(finish(s, d)): s for s, d in sessions}
        waits: set[asyncio.Future[Any]] = set()
        try:
            if tasks:
                everything = asyncio.gather(*tasks, return_exceptions=True)
                waits.add(everything)
                if force is not None:
                    waits.add(asyncio.ensure_future(force.wait()))
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                waits.discard(everything)
        finally:
            for wait in waits:
                wait.cancel()
            stopped = [s for s, _ in sessions] if stop_now else []
            for task, session in tasks.items():
                if not task.done():
                    task.cancel()
                    stopped.append(session)
            for session in stopped:
                finals, seconds = session.abandon()
                if finals:
                    logger.warning(
                        "shutdown: {} finals ({:.1f} s of audio) of a streaming session "
                        "not transcribed",
                        finals,
                        seconds,
                    )
            await asyncio.gather(*tasks, return_exceptions=True)
