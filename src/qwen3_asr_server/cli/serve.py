"""Run the server: uvicorn with our app, and a uvicorn.Server that finalizes streaming
sessions before closing their sockets.

uvicorn closes WebSocket connections before it runs the app's lifespan shutdown, so a final
produced there could only be logged. This server first stops accepting connections, then
asks the app to finalize its sessions, then lets uvicorn close what is left: a connection
can no longer be accepted while the sessions drain, and miss its finals.

Bounded: the sessions' finals get SHUTDOWN_TIMEOUT seconds, and uvicorn's wait for open
requests and sockets what is left of it (then it cancels them). A second SIGTERM or SIGINT
stops the shutdown at once (uvicorn alone heeds only a second SIGINT, and only after the
finals): the finals not transcribed are logged.
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import time
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..config import Settings

# Slow clients (issue 58 §7.8): uvicorn drops an idle keep-alive connection, but holds one
# whose request head trickles in (slowloris) for ever; its head must be whole this soon.
HEAD_TIMEOUT_S = 10.0
MAX_HEAD_BYTES = 64 * 1024  # and no larger (httptools itself sets no limit)


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._forced: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            super().handle_exit(sig, frame)
            return
        self._captured_signals.append(sig)  # (uvicorn raises them again once it is done)
        self.force_exit = True  # a second signal, whichever: stop now
        if self._forced is not None:  # (a signal handler: only the thread-safe call)
            loop, event = self._forced
            loop.call_soon_threadsafe(event.set)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:  # stop accepting first (uvicorn does it again: no-op)
            server.close()
        for sock in sockets or []:
            sock.close()
        ctx: Any = getattr(getattr(self.config.app, "state", None), "ctx", None)
        if ctx is not None:
            timeout = ctx.settings.shutdown_timeout
            deadline = time.monotonic() + timeout
            forced = asyncio.Event()
            self._forced = (asyncio.get_running_loop(), forced)
            if self.force_exit:
                forced.set()
            # open utterances get their finals, then close
            await ctx.sessions.close_all(timeout, forced)
            if self.config.timeout_graceful_shutdown is None:  # uvicorn waits for the rest
                self.config.timeout_graceful_shutdown = max(deadline - time.monotonic(), 1.0)
        await super().shutdown(sockets)


class HeadTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's HTTP protocol, closing a connection whose request head (request line and
    headers) is not complete HEAD_TIMEOUT_S after the connection opened or the previous
    response ended, or is over MAX_HEAD_BYTES. A request being served is never cut."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_bytes = 0
        self._head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._head_too_slow)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._serving():
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                self.transport.close()

    def on_headers_complete(self) -> None:
        self._head_timer.cancel()
        self._head_bytes = 0
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._head_timer.cancel()
        if not self.transport.is_closing():
            self._head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._head_too_slow)

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_timer.cancel()
        super().connection_lost(exc)

    def _serving(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _head_too_slow(self) -> None:
        if not self._serving() and not self.transport.is_closing():
            self.transport.close()


def serve(settings: Settings) -> None:
    from ..app import create_app

    if settings.pytorch_cuda_alloc_conf:  # torch reads it from the environment
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", settings.pytorch_cuda_alloc_conf)
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_config=None,  # our InterceptHandler routes uvicorn's logs through loguru
        access_log=True,
        ws_max_size=4 * settings.ws_max_frame_bytes,  # beyond: the protocol closes (1009)
        http=HeadTimeoutProtocol,
        timeout_keep_alive=5,  # an idle keep-alive connection is closed after 5 s
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
    )
    # Everything imported and built so far lives as long as the process: the collector need
    # not scan it again. Without this, gen2 collections paused the event loop 90-160 ms
    # with 100 streams on a core, 20-60 ms with it (LEARNING_LOG.md). Models load later and
    # are never frozen, so an idle unload still frees them.
    gc.collect()  # (start-up garbage is freed, not frozen)
    gc.freeze()
    Server(config).run()
