"""The remote engine's backends: their state, the choice of one per job, the backoff of the
ones that are down (BackendPool: thread-safe, the scheduler's threads and the HTTP loop share
it) and the health probes that keep their states current (Prober, on the HTTP loop)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import httpx
from loguru import logger

from ...logging import redact_url
from ..base import BackendUnavailableError, JobCancelledError, ShouldStop, never_stop
from ..status import Buckets
from ..wrapping import POLL

PROBE_TICK = 0.2  # seconds between two looks for backends whose probe is due


def response_message(response: httpx.Response) -> str:
    """A backend's error answer, short: OpenAI's `error.message`, else the body."""
    try:
        body = response.json()
        error = body.get("error", body) if isinstance(body, dict) else body
        text = error.get("message") if isinstance(error, dict) else None
        return str(text or body)[:300]
    except ValueError:
        return response.text[:300]


def split_credentials(url: str) -> tuple[str, str | None]:
    """`http://user:pass@host/v1` -> (`http://host/v1`, the Basic `Authorization` value for
    user:pass). A URL without userinfo comes back as it is, with None."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    clean = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    userpass = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
    return clean, "Basic " + base64.b64encode(userpass.encode()).decode()


@dataclass
class Backend:
    url: str  # base URL ending in /v1, without credentials: where requests go
    max_inflight: int
    label: str = ""  # how the URL is shown (health, metrics, logs, errors): no password
    authorization: str | None = field(default=None, repr=False)  # from the URL's userinfo
    state: str = "unknown"  # unknown | up | down
    model: str | None = None
    inflight: int = 0
    requests: int = 0  # jobs answered
    errors: int = 0  # jobs this backend failed
    seconds: float = 0.0  # total time of answered jobs
    last_error: str | None = None
    failures: int = 0  # consecutive failed probes or jobs
    hung: bool = False  # timed out on a job: back in the rotation only after a trial job
    next_probe: float = 0.0  # monotonic
    picked: int = 0  # when it was last chosen (round robin among equals)
    # answered jobs' times (/metrics)
    latency: Buckets = field(default_factory=Buckets, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.label = self.label or redact_url(self.url)

    @property
    def headers(self) -> dict[str, str]:
        """Headers this backend's requests carry besides the client's (its credentials)."""
        return {"Authorization": self.authorization} if self.authorization else {}

    def status(self, now: float) -> dict[str, Any]:
        latency = round(1000 * self.seconds / self.requests, 1) if self.requests else None
        down = self.state == "down"
        return {
            "url": self.label,
            "state": self.state,
            "model": self.model,
            "inflight": self.inflight,
            "max_inflight": self.max_inflight,
            "requests": self.requests,
            "errors": self.errors,
            "seconds": round(self.seconds, 3),
            "latency_ms_avg": latency,
            "last_error": self.last_error,
            "probe_in_s": round(max(0.0, self.next_probe - now), 1) if down else None,
        }


class BackendPool:
    def __init__(self, urls: list[str], max_inflight: int, probe_interval: float) -> None:
        self.backends = [
            Backend(clean, max_inflight, redact_url(url), auth)
            for url in urls
            for clean, auth in [split_credentials(url)]
        ]
        self.probe_interval = probe_interval
        # One lock; release, mark_up and mark_down wake the jobs waiting for a slot.
        self._lock = threading.Condition()
        self._picks = itertools.count(1)
        self.waiting = 0  # jobs waiting for a slot (every usable backend is full)
        self.slot_wait = Buckets()  # how long each job waited for its slot (/metrics)

    @property
    def slots(self) -> int:
        return sum(b.max_inflight for b in self.backends)

    def status(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        with self._lock:
            return [b.status(now) for b in self.backends]

    def due(self, now: float) -> list[Backend]:
        """Backends whose next probe is due."""
        with self._lock:
            return [b for b in self.backends if b.next_probe <= now]

    def acquire(
        self, exclude: list[Backend], should_stop: ShouldStop = never_stop
    ) -> Backend | None:
        """The backend with the fewest jobs in flight, not down and not tried yet; None when
        every such backend is down. When all of them are full (REMOTE_MAX_INFLIGHT each: the
        others may be down, so the scheduler runs more jobs than they take), wait for a
        slot; JobCancelledError if every caller of the job goes meanwhile."""
        started = time.monotonic()
        with self._lock:
            waited = False
            try:
                while True:
                    usable = [b for b in self.backends if b.state != "down" and b not in exclude]
                    if not usable:
                        return None
                    free = [b for b in usable if b.inflight < b.max_inflight]
                    if free:
                        chosen = min(free, key=lambda b: (b.inflight / b.max_inflight, b.picked))
                        chosen.inflight += 1
                        chosen.picked = next(self._picks)
                        return chosen
                    if should_stop():
                        raise JobCancelledError()
                    if not waited:  # counted once per waiting job, not once per poll
                        waited = True
                        self.waiting += 1
                    self._lock.wait(POLL)
            finally:  # (every wait counts: those that ended cancelled or unserved too)
                self.slot_wait.observe(time.monotonic() - started)
                if waited:
                    self.waiting -= 1

    def release(self, backend: Backend, outcome: str, seconds: float = 0.0) -> None:
        """A job left the backend: `answered` (in `seconds`), `failed` or `cancelled`."""
        with self._lock:
            backend.inflight -= 1
            self._lock.notify_all()
            if outcome == "failed":
                backend.errors += 1
            elif outcome == "answered":
                backend.requests += 1
                backend.seconds += seconds
                backend.latency.observe(seconds)

    def mark_up(self, backend: Backend, model: str | None) -> None:
        """Back in the rotation (a probe answered, or for a hung backend a trial job)."""
        with self._lock:
            backend.hung = False
            if backend.state != "up":
                logger.info("remote backend {} is up", backend.label)
            backend.state, backend.failures, backend.last_error = "up", 0, None
            backend.next_probe = time.monotonic() + self.probe_interval
            if model:
                backend.model = model

    def mark_down(self, backend: Backend, reason: str, hung: bool = False) -> None:
        """Out of the rotation; probed again after 1, 2, 4 ... s, up to the probe interval.
        `hung`: it timed out on a job, so only a trial job (not `/v1/models`) brings it back."""
        with self._lock:
            backend.hung = backend.hung or hung
            if backend.state != "down":
                logger.warning("remote backend {} is down: {}", backend.label, reason)
            backend.state, backend.last_error = "down", reason
            backend.failures += 1
            delay = min(2.0 ** (backend.failures - 1), self.probe_interval)
            backend.next_probe = time.monotonic() + delay

    def unavailable(self, failure: str) -> BackendUnavailableError:
        """The 503 for a job no backend could take: every backend, its state and last error."""
        now = time.monotonic()
        with self._lock:
            states = ", ".join(
                f"{b.label} ({b.state}{': ' + b.last_error if b.last_error else ''})"
                for b in self.backends
            )
            waits = [b.next_probe - now for b in self.backends if b.state == "down"]
        retry = max(1.0, min(waits, default=1.0))
        detail = f" Last failure: {failure}." if failure else ""
        return BackendUnavailableError(
            f"No remote backend could take the job. Backends: {states}.{detail}", retry
        )


class Prober:
    """Probes the pool's backends on the HTTP loop: each once at start, then each again when
    its probe is due (`BackendPool.due`: every probe interval while up, with backoff while
    down). `on_model` (None when REMOTE_MODEL is set) hears the model id a backend names."""

    def __init__(
        self,
        pool: BackendPool,
        client: httpx.AsyncClient,
        timeout: float,
        on_model: Callable[[str], None] | None,
        trial: Callable[[Backend], Awaitable[str | None]] | None = None,
    ) -> None:
        self.pool = pool
        self._trial = trial  # a short real job, for a backend that timed out on one
        self._client = client
        self._timeout = timeout
        self._on_model = on_model
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Probe every backend once, then keep probing (a task on the running loop)."""
        await asyncio.gather(*(self.probe(b) for b in self.pool.backends))
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(PROBE_TICK)
            due = self.pool.due(time.monotonic())
            if due:
                await asyncio.gather(*(self.probe(b) for b in due))

    async def probe(self, backend: Backend) -> None:
        """GET /v1/models (or /health beside it): any answer but 401/403/5xx means up. A
        backend that timed out on a job must answer a trial job instead."""
        if backend.hung and self._trial is not None:
            why = await self._trial(backend)
            if why is None:
                self.pool.mark_up(backend, None)
            else:
                self.pool.mark_down(backend, f"timed out on a job; {why}", hung=True)
            return
        timeout, headers = self._timeout, backend.headers
        try:
            r = await self._client.get(f"{backend.url}/models", timeout=timeout, headers=headers)
            if r.status_code == 404:
                root = backend.url.removesuffix("/v1")
                r = await self._client.get(f"{root}/health", timeout=timeout, headers=headers)
        except httpx.HTTPError as exc:
            self.pool.mark_down(backend, f"unreachable: {type(exc).__name__}: {exc}")
            return
        if r.status_code in (401, 403):
            what = (
                "the credentials in REMOTE_BACKENDS" if backend.authorization else "REMOTE_API_KEY"
            )
            self.pool.mark_down(backend, f"HTTP {r.status_code}: check {what}")
            return
        if r.status_code >= 500:
            self.pool.mark_down(backend, f"HTTP {r.status_code}: {response_message(r)}")
            return
        model = None
        if r.status_code == 200 and self._on_model is not None:
            with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
                model = str(r.json()["data"][0]["id"])
        self.pool.mark_up(backend, model)
        if model and self._on_model is not None:
            self._on_model(model)
