"""ModelManager: load on first use (single flight), unload when idle, never while in use.

States: unloaded -> loading -> loaded -> unloading -> unloaded. Every transition happens on
the event loop; the blocking load/unload runs in a thread inside one task per transition:

- A load is one task. Every waiter awaits that same task through `asyncio.shield`, so a
  waiter that is cancelled (client timeout, disconnect, a partial superseded) never cancels
  the load and never starts a second one.
- An unload is one task too. A request that arrives during it waits for it to finish and
  then loads again; it never receives an engine that is being torn down.
- A waiter waits at most `load_timeout` seconds (REQUEST_TIMEOUT) for a load, then gets a
  503 (`model_loading`) saying how long it has been loading; the load goes on (a hung
  download or `from_pretrained` would otherwise hold every request forever).
- A failed load answers every waiter of that load with one 503. The next attempt waits for
  a backoff (`retry_backoff`, doubling up to `max_backoff`); until then requests get a 503
  whose Retry-After says when the server will try again.
- A hub model missing from the cache is first downloaded in the background (`download`, a
  `hub_fetch.BackgroundDownload` with the same backoff); until it is done a request gets a
  503 (`model_downloading`) with the progress, never a wait. PRELOAD loads right after it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Literal

from loguru import logger

from ..engines.base import Engine
from ..errors import ModelLoadError, ServiceError, UnavailableError
from ..models.hub_fetch import BackgroundDownload
from ..models.plan import Fallback, short_load_error

State = Literal["unloaded", "loading", "loaded", "unloading"]
LOADING_RETRY_AFTER_S = 10  # a waiter that gave up on a load in progress: when to come back


class ModelManager:
    """Owns the engine's loaded state.

    `use()` holds a reference for as long as a request needs the model (queue wait
    included); the idle watchdog unloads only when nobody holds one, `busy()` is false
    (the inference thread may still be finishing a job whose caller gave up) and
    `idle_timeout` seconds have passed since the last use.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        idle_timeout: float,
        busy: Callable[[], bool] = lambda: False,
        check_interval: float | None = None,
        retry_backoff: float = 5.0,
        max_backoff: float = 60.0,
        load_timeout: float | None = None,
        download: list[str] | BackgroundDownload | None = None,
        fallback: Fallback | None = None,
        precheck: Callable[[str], None] | None = None,
    ) -> None:
        self.engine = engine
        self.idle_timeout = idle_timeout
        self._busy = busy
        self._interval = check_interval or max(0.05, min(idle_timeout / 4, 5.0))
        self._retry_backoff = retry_backoff
        self._max_backoff = max_backoff
        self.load_timeout = load_timeout  # how long `use()` waits for a load; None: no limit
        self._load_started = 0.0  # monotonic, when the current load began
        self._users = 0
        self._last_used = time.monotonic()
        self._watchdog: asyncio.Task[None] | None = None
        self._load_task: asyncio.Task[None] | None = None
        self._unload_task: asyncio.Task[None] | None = None
        self._failures = 0  # consecutive failed loads
        self._retry_at = 0.0  # monotonic time before which no new load is attempted
        self.state: State = "unloaded"
        self.loads = 0
        self.unloads = 0
        self.load_attempts = 0
        self.last_error: str | None = None
        self.last_load_seconds = 0.0
        self.fallback = fallback  # the bundled model serves instead of the default (announced)
        self._precheck = precheck  # raises ModelLoadError before a load that cannot work
        if isinstance(download, list):  # hub repos missing from the cache
            download = (
                BackgroundDownload(download, retry_backoff=retry_backoff, max_backoff=max_backoff)
                if download
                else None
            )
        self.download = download
        self._download_task: asyncio.Task[None] | None = None

    @property
    def loaded(self) -> bool:
        return self.state == "loaded"

    @property
    def users(self) -> int:
        return self._users

    def retry_in(self) -> float:
        """Seconds until the next load may be attempted after a failure (0: now)."""
        return max(0.0, self._retry_at - time.monotonic())

    async def start(self, preload: bool = False) -> None:
        """Start the background download (if any; PRELOAD loads after it), or load now with
        `preload`. A failed preload is logged and the server stays up."""
        if self.download is not None and not self.download.done:
            self._download_task = asyncio.create_task(
                self._download_then(preload), name="model-download"
            )
        elif preload:
            await self._preload()
        if self.idle_timeout > 0:
            self._watchdog = asyncio.create_task(self._watch(), name="idle-watchdog")

    async def _preload(self) -> None:
        try:
            await self.ensure_loaded()
        except ServiceError as exc:  # stay up; the next request tries again
            logger.error("PRELOAD failed, serving anyway: {}", exc.message)

    async def _download_then(self, preload: bool) -> None:
        assert self.download is not None
        await self.download.run()
        if preload:
            await self._preload()

    async def stop(self) -> None:
        if self._download_task is not None:
            self._download_task.cancel()
            with suppress(asyncio.CancelledError):
                await self._download_task
            self._download_task = None
        if self._watchdog is not None:
            self._watchdog.cancel()
            with suppress(asyncio.CancelledError):
                await self._watchdog
            self._watchdog = None
        for task in (self._load_task, self._unload_task):
            if task is not None:
                with suppress(Exception):
                    await asyncio.shield(task)
        if self.loaded:
            await self._begin_unload()

    # -- loading -----------------------------------------------------------------------
    def loading_for(self) -> float:
        """Seconds the current load has been running (0 when none runs)."""
        return time.monotonic() - self._load_started if self.state == "loading" else 0.0

    async def ensure_loaded(self, timeout: float | None = None) -> None:
        """Load the model if needed and wait for it, at most `timeout` seconds (then 503
        `model_loading`; the load goes on for the next callers)."""
        if timeout is None:
            await self._ensure_loaded()
            return
        try:
            async with asyncio.timeout(timeout):
                await self._ensure_loaded()
        except TimeoutError:
            raise self._still_loading(timeout) from None

    def _still_loading(self, waited: float) -> UnavailableError:
        loading = self.state == "loading"
        state = (
            f"has been loading for {self.loading_for():.0f} s" if loading else f"is {self.state}"
        )
        return UnavailableError(
            f"The model {self.engine.model_id!r} {state} and was not ready within "
            f"{waited:g} s (REQUEST_TIMEOUT).{' The load goes on.' if loading else ''} "
            "Retry later (GET /health shows model_state).",
            code="model_loading",
            retry_after=LOADING_RETRY_AFTER_S,
        )

    async def _ensure_loaded(self) -> None:
        while self.state != "loaded":
            if self._unload_task is not None:  # wait for the teardown, then load afresh
                with suppress(Exception):
                    await asyncio.shield(self._unload_task)
                continue
            if self._load_task is None:
                if self.download is not None and not self.download.done:
                    raise self.download.unavailable()  # never wait on a download
                wait = self.retry_in()
                if wait > 0:
                    seconds = math.ceil(wait)
                    raise UnavailableError(
                        f"{self.last_error} The server will try to load the model again in "
                        f"{seconds} s.",
                        code="model_unavailable",
                        retry_after=seconds,
                    )
                self.state = "loading"
                self._load_started = time.monotonic()
                self._load_task = asyncio.create_task(self._load(), name="model-load")
                self._load_task.add_done_callback(_consume_error)
            await asyncio.shield(self._load_task)  # raises the load's error to every waiter

    async def _load(self) -> None:
        started = time.perf_counter()
        self.load_attempts += 1
        logger.info("loading {} model {}", self.engine.name, self.engine.model_id)
        try:
            if self._precheck is not None:
                await asyncio.to_thread(self._precheck, self.engine.model_id)
            await asyncio.to_thread(self.engine.load)
        except asyncio.CancelledError:  # only at shutdown: the waiters are shielded
            self.state = "unloaded"
            raise
        except Exception as exc:
            self.state = "unloaded"
            self._failures += 1
            backoff = min(self._max_backoff, self._retry_backoff * 2 ** min(self._failures - 1, 16))
            self._retry_at = time.monotonic() + backoff
            if isinstance(exc, ModelLoadError):
                self.last_error = short_load_error(self.engine.model_id, exc)
                if exc.__cause__ is not None:  # the library's exception: to the log only
                    logger.opt(exception=exc.__cause__).error(
                        "model load failed (retry in {:g} s): {}", backoff, exc
                    )
                else:
                    logger.error("model load failed (retry in {:g} s): {}", backoff, exc)
            else:
                self.last_error = (
                    f"Could not load the model {self.engine.model_id!r}: "
                    f"{type(exc).__name__}: {exc}"
                )
                logger.opt(exception=exc).error("model load failed (retry in {:g} s)", backoff)
            raise UnavailableError(
                f"{self.last_error} The server will try again in {backoff:g} s.",
                code="model_unavailable",
                retry_after=math.ceil(backoff),
            ) from exc
        finally:
            self._load_task = None
        self.state = "loaded"
        self.loads += 1
        self._failures = 0
        self._retry_at = 0.0
        self.last_error = None
        self._last_used = time.monotonic()
        self.last_load_seconds = time.perf_counter() - started
        logger.info("model loaded on {} in {:.2f} s", self.engine.device, self.last_load_seconds)

    @asynccontextmanager
    async def use(self) -> AsyncIterator[Engine]:
        """Hold the model loaded for the duration of the block."""
        self._users += 1  # counted before loading, so the watchdog cannot race the load
        try:
            await self.ensure_loaded(self.load_timeout)
            yield self.engine
        finally:
            self._users -= 1
            self._last_used = time.monotonic()

    # -- unloading ---------------------------------------------------------------------
    def idle_for(self) -> float:
        return time.monotonic() - self._last_used

    async def unload_if_idle(self) -> bool:
        if not self._idle():
            return False
        logger.info("unloading the model after {:.0f} s idle", self.idle_for())
        await self._begin_unload()
        return True

    async def _begin_unload(self) -> None:
        """Tear the engine down in a thread; callers during it wait, then load again."""
        self.state = "unloading"
        self._unload_task = asyncio.create_task(self._unload(), name="model-unload")
        await asyncio.shield(self._unload_task)

    async def _unload(self) -> None:
        try:
            await asyncio.to_thread(self.engine.unload)
        finally:
            self.state = "unloaded"
            self.unloads += 1
            self._unload_task = None

    def _idle(self) -> bool:
        return (
            self.state == "loaded"
            and self._users == 0
            and not self._busy()
            and self.idle_timeout > 0
            and self.idle_for() >= self.idle_timeout
        )

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.unload_if_idle()
            except Exception as exc:  # keep watching; a failed unload is logged, not fatal
                logger.opt(exception=exc).error("idle unload failed")


def _consume_error(task: asyncio.Task[None]) -> None:
    """A load whose waiters all went away must not log 'exception never retrieved'."""
    if not task.cancelled():
        task.exception()
