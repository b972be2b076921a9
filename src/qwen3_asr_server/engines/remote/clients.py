"""ENGINE=remote: the httpx clients the jobs' requests go out on (`remote.py` sends them).

Each job in flight takes a client of its own with one keep-alive connection: httpcore's
pool scans all of its connections for every request and every answer, which cost a front a
quarter of its CPU with one shared client and many streams (docs/SCALING.md).
"""

from __future__ import annotations

import asyncio

import httpx


class ClientShelf:
    """Idle httpx clients per backend URL, each with at most one (keep-alive) connection: a
    job takes one and puts it back. There are never more per backend than it has jobs in
    flight (REMOTE_MAX_INFLIGHT, kept by the pool). Used on the HTTP loop only.

    Only a client whose request was answered goes back on the shelf. One whose request was
    cancelled or failed is closed: httpcore 1.0.9 can leave a connection cancelled while it
    was being opened in its pool for good (encode/httpcore#1093), and with one connection
    per client every later job on that client would wait for it until the timeout."""

    def __init__(self, timeout: httpx.Timeout, headers: dict[str, str]) -> None:
        self._timeout = timeout
        self._headers = headers
        self._tls = httpx.create_ssl_context()  # one for all (each client would load its own)
        self._idle: dict[str, list[httpx.AsyncClient]] = {}
        self._all: set[httpx.AsyncClient] = set()
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False

    def take(self, url: str) -> httpx.AsyncClient:
        idle = self._idle.setdefault(url, [])
        if idle:
            return idle.pop()
        client = httpx.AsyncClient(
            timeout=self._timeout,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
            headers=self._headers,
            verify=self._tls,
        )
        self._all.add(client)
        return client

    def put_back(self, url: str, client: httpx.AsyncClient, answered: bool) -> None:
        if answered and client in self._all and not self._closed:
            self._idle.setdefault(url, []).append(client)
            return
        self._all.discard(client)
        closing = asyncio.get_running_loop().create_task(client.aclose())
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        """Close every client, and wait for the closes begun by jobs that end meanwhile."""
        self._closed = True
        clients, self._all, self._idle = list(self._all), set(), {}
        await asyncio.gather(*(c.aclose() for c in clients), return_exceptions=True)
        while self._closing:
            await asyncio.gather(*list(self._closing), return_exceptions=True)
