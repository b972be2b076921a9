"""Run a real uvicorn server for a test, in a background thread, on a free loopback port."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn
from fastapi import FastAPI

from qwen3_asr_server.cli.serve import Server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LiveServer:
    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_config=None, ws_max_size=4 * 1024 * 1024
        )
        self.server = Server(config)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self.server_loop = asyncio.get_running_loop()
        await self.server.serve()

    def start(self, timeout: float = 30.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server.started:
                return
            if not self.thread.is_alive():
                raise RuntimeError("server thread died during startup")
            time.sleep(0.02)
        raise TimeoutError("server did not start")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    @property
    def ctx(self):  # type: ignore[no-untyped-def]
        return self.app.state.ctx

    @property
    def engine(self):  # type: ignore[no-untyped-def]
        """The engine the test gave the app, inside the speaker-diarizing wrapper."""
        return self.ctx.manager.engine.inner

    def get(self, path: str, **kwargs: object) -> httpx.Response:
        return httpx.get(self.url + path, timeout=60, **kwargs)  # type: ignore[arg-type]


@contextmanager
def live_server(app: FastAPI) -> Iterator[LiveServer]:
    server = LiveServer(app)
    server.start()
    try:
        yield server
    finally:
        server.stop()
