"""Stop a request's work when its client disconnects while it waits for the answer.

A plain (non-streaming) response is written only at the end, so nothing notices a client
that left until then. Here the request's ASGI `receive()` is watched while the work runs: the
body has been read, so the next message is `http.disconnect`, sent as soon as the client
closes the connection. The work is then cancelled: segments not yet submitted never are,
queued jobs are taken out of the queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from fastapi import Request
from loguru import logger

from ..errors import ServiceError

T = TypeVar("T")


class ClientClosedError(ServiceError):
    """The client went away first; nobody reads this answer (logs and metrics do: 499 in
    `api/error_table.py`)."""

    code = "client_closed_request"


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_client_leaves(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """Await `work`; if the client disconnects first, cancel it and raise ClientClosedError."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and watcher.exception() is None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            logger.info("the client disconnected; its remaining work was cancelled")
            raise ClientClosedError("The client closed the connection before the answer.")
        return await task
    finally:
        for pending in (task, watcher):
            pending.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
