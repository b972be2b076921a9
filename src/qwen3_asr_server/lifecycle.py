"""ModelManager: load on first use (single flight), unload when idle, never while in use."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress

from loguru import logger

from .engines.base import Engine, ModelLoadError
from .errors import ModelUnavailableError


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
    ) -> None:
        self.engine = engine
        self.idle_timeout = idle_timeout
        self._busy = busy
        self._interval = check_interval or max(0.05, min(idle_timeout / 4, 5.0))
        self._lock = asyncio.Lock()
        self._users = 0
        self._last_used = time.monotonic()
        self._watchdog: asyncio.Task[None] | None = None
        self.loaded = False
        self.loads = 0
        self.unloads = 0
        self.last_error: str | None = None

    @property
    def users(self) -> int:
        return self._users

    async def start(self, preload: bool = False) -> None:
        if preload:
            await self.ensure_loaded()
        if self.idle_timeout > 0:
            self._watchdog = asyncio.create_task(self._watch(), name="idle-watchdog")

    async def stop(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            with suppress(asyncio.CancelledError):
                await self._watchdog
            self._watchdog = None
        async with self._lock:
            if self.loaded:
                await asyncio.to_thread(self._unload)

    async def ensure_loaded(self) -> None:
        if self.loaded:
            return
        async with self._lock:
            if self.loaded:
                return
            started = time.perf_counter()
            logger.info("loading {} model {}", self.engine.name, self.engine.model_id)
            try:
                await asyncio.to_thread(self.engine.load)
            except ModelLoadError as exc:
                self.last_error = str(exc)
                logger.error("model load failed: {}", exc)
                raise ModelUnavailableError(str(exc)) from exc
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                logger.opt(exception=exc).error("model load failed")
                raise ModelUnavailableError(
                    f"Could not load the model {self.engine.model_id!r}: {self.last_error}"
                ) from exc
            self.loaded = True
            self.loads += 1
            self.last_error = None
            self._last_used = time.monotonic()
            logger.info(
                "model loaded on {} in {:.2f} s", self.engine.device, time.perf_counter() - started
            )

    @asynccontextmanager
    async def use(self) -> AsyncIterator[Engine]:
        """Hold the model loaded for the duration of the block."""
        self._users += 1  # counted before loading, so the watchdog cannot race the load
        try:
            await self.ensure_loaded()
            yield self.engine
        finally:
            self._users -= 1
            self._last_used = time.monotonic()

    def idle_for(self) -> float:
        return time.monotonic() - self._last_used

    async def unload_if_idle(self) -> bool:
        if not self._idle():
            return False
        async with self._lock:
            if not self._idle():
                return False
            logger.info("unloading the model after {:.0f} s idle", self.idle_for())
            await asyncio.to_thread(self._unload)
            return True

    def _idle(self) -> bool:
        return (
            self.loaded
            and self._users == 0
            and not self._busy()
            and self.idle_timeout > 0
            and self.idle_for() >= self.idle_timeout
        )

    def _unload(self) -> None:
        try:
            self.engine.unload()
        finally:
            self.loaded = False
            self.unloads += 1

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.unload_if_idle()
            except Exception as exc:  # keep watching; a failed unload is logged, not fatal
                logger.opt(exception=exc).error("idle unload failed")
