"""Voices: live speakers' fingerprints, for every stream, from one child process.

- One child (`engines/speakers/process.py` with a `voices` spec: CAM++, one torch thread)
  serves every diarized live stream, apart from the uploads' diarizer (a long diarization
  holds that one for minutes; a final must not wait behind it). It is spawned, never
  forked; the model never runs in the server.
- Every blocking call to it (start, embed, stop) runs on one dedicated worker thread, never
  on the event loop. Clips that arrive while a call is in flight are gathered and sent as
  one message next, whichever streams they come from; each caller gets its own rows.
- A caller bounds its own wait (`asyncio.wait_for`): one that leaves only drops its rows.
- The child starts when a diarized stream opens (`open()`), in the background, so the first
  final rarely waits for the load; a call during the start waits for it.
- A child that dies makes every waiting and later call raise `SpeakersUnavailable` at once,
  naming the death, while a fresh one starts in the background after a backoff (doubling
  while starts or calls keep failing, so a crash loop does not spin).
- With no diarized stream open and no call for IDLE_TIMEOUT seconds, the child is stopped
  and its memory given back (0: never).
- A final sent without a speaker is counted (`missed`) and logged, at most once per
  `LOG_EVERY` seconds per reason; /health shows why (`status()`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from loguru import logger

from ..engines.speakers.diarize import installed
from ..engines.speakers.embed import EMBEDDING
from ..engines.speakers.process import DiarizerSpec, ProcessDiarizer, embed_deadline_s

LOG_EVERY = 10.0  # seconds between warnings about finals without a speaker, per reason
BACKOFF = 0.25  # seconds before the first restart after a death; doubles up to MAX_BACKOFF
MAX_BACKOFF = 30.0
TICK = 0.25  # seconds between the watchdog's looks at the child (death, idleness)
REASONS_KEPT = 64  # distinct reasons whose warnings are rate-limited (the oldest go)
SLOW_S = 2.0  # a call this much past its expected time: /health says the child is not answering


class SpeakersUnavailable(Exception):
    """No fingerprints now: the child is down, died, or could not start. `reason` says why,
    in words for /health and the log."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class VoicesStatus:
    """The live speakers' child process, as /health shows it."""

    pid: int | None
    state: str  # stopped | starting | ready | not_answering | exited
    restarts: int  # children that died or were killed
    streams: int  # diarized live streams open
    missing: int  # finals sent without a speaker
    last_missing_reason: str | None
    embedded: int  # clips fingerprinted
    messages: int  # calls to the child (clips gathered from every stream into each)
    cpu_seconds: float  # the running child's CPU time, user plus system
    reason: str | None  # why there are no fingerprints now (None when there can be)


class Voices:
    """The async face of the live speakers' child (see the module's text)."""

    def __init__(self, spec: DiarizerSpec, *, idle_timeout: float, timeout: float = 60.0) -> None:
        self._child = ProcessDiarizer(spec, timeout=timeout)
        self.idle_timeout = idle_timeout
        self._executor: ThreadPoolExecutor | None = None
        self._state = "stopped"
        self._reason: str | None = None  # why embed() fails now
        self._start_task: asyncio.Task[None] | None = None
        self._cold = False  # the start in progress is a first one (not a restart after a death)
        self._restart_task: asyncio.Task[None] | None = None
        self._pump_task: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._pending: list[tuple[list[np.ndarray], asyncio.Future[np.ndarray]]] = []
        self._failures = 0  # deaths and failed starts since the last answered call
        self._last_used = time.monotonic()
        self._streams = 0
        self._overdue_at: float | None = None  # when the call in flight is late
        self._missing = 0
        self._last_missing: str | None = None
        self._logged: dict[str, tuple[float, int]] = {}  # reason: (last warning, count since)
        self.embedded = 0
        self.messages = 0

    # -- the app's lifespan ------------------------------------------------------------------
    async def start(self) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="voices")
        self._watchdog = asyncio.create_task(self._watch(), name="voices-watchdog")

    async def stop(self) -> None:
        """Stop the watchdog, fail every waiting call, and stop the child."""
        if self._overdue_at is not None:  # a call in flight: a hung child is not waited for
            self._child.kill()
        for task in (self._watchdog, self._restart_task, self._pump_task, self._start_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        self._fail("the server is shutting down")
        if self._executor is not None:
            await self._call(self._child.unload)
            self._executor.shutdown(wait=False)  # idle: the stop above was its last call
            self._executor = None
        self._state = "stopped"

    # -- streams -----------------------------------------------------------------------------
    def open(self) -> None:
        """A diarized stream opened: start the child in the background if it is not running."""
        self._streams += 1
        self._last_used = time.monotonic()
        if self._state == "stopped":
            self._begin_start()

    def close(self) -> None:
        """A diarized stream closed."""
        self._streams = max(0, self._streams - 1)
        self._last_used = time.monotonic()

    def missed(self, reason: str) -> None:
        """A final went out without a speaker, for `reason`: counted, logged (rate-limited)."""
        self._missing += 1
        self._last_missing = reason
        now = time.monotonic()
        last, since = self._logged.pop(reason, (-LOG_EVERY, 0))
        since += 1
        if now - last >= LOG_EVERY:
            logger.warning("live speakers: {} final(s) sent without a speaker: {}", since, reason)
            last, since = now, 0
        self._logged[reason] = (last, since)
        while len(self._logged) > REASONS_KEPT:
            del self._logged[next(iter(self._logged))]

    # -- fingerprints ------------------------------------------------------------------------
    async def embed(self, clips: list[np.ndarray]) -> np.ndarray:
        """16 kHz float32 clips -> their fingerprints, (len(clips), 192) unit vectors. Raises
        `SpeakersUnavailable` at once while the child is down; waits for a start in progress
        (bound the wait with `asyncio.wait_for`)."""
        if not clips:
            return np.zeros((0, EMBEDDING), dtype=np.float32)
        self._last_used = time.monotonic()
        self._check()
        if self._state == "exited" or self._executor is None:
            raise SpeakersUnavailable(self._reason or "live speakers are not running")
        if self._state == "stopped":
            self._begin_start()
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self._pending.append((list(clips), future))
        if self._pump_task is None:
            self._pump_task = asyncio.create_task(self._pump(), name="voices-pump")
        return await future

    async def _pump(self) -> None:
        """Send the waiting clips, all of them together, until none wait."""
        try:
            while self._pending:
                if self._state != "ready":
                    try:
                        await self._wait_started()
                    except SpeakersUnavailable as exc:
                        self._fail(exc.reason)
                        continue
                batch = [(clips, f) for clips, f in self._pending if not f.done()]
                self._pending = []
                if not batch:
                    continue
                clips = [clip for own, _ in batch for clip in own]
                samples = sum(len(clip) for clip in clips)
                expected = SLOW_S + embed_deadline_s(samples) / 10  # a tenth of its deadline
                self._overdue_at = time.monotonic() + expected
                try:
                    vectors = await self._call(self._child.embed, clips)
                except Exception as exc:
                    self._answer(batch, self._broken(exc))
                    continue
                finally:
                    self._overdue_at = None
                self.messages += 1
                self.embedded += len(clips)
                self._failures = 0
                self._last_used = time.monotonic()
                at = 0
                for own, future in batch:
                    if not future.done():
                        future.set_result(vectors[at : at + len(own)])
                    at += len(own)
        finally:
            self._pump_task = None

    def _answer(self, batch: list[tuple[Any, asyncio.Future[np.ndarray]]], exc: Exception) -> None:
        for _, future in batch:
            if not future.done():
                future.set_exception(exc)

    def _fail(self, reason: str) -> None:
        """Every waiting call: `SpeakersUnavailable(reason)`."""
        pending, self._pending = self._pending, []
        self._answer(pending, SpeakersUnavailable(reason))

    # -- the child's lifecycle ---------------------------------------------------------------
    async def _call(self, fn: Any, *args: Any) -> Any:
        assert self._executor is not None, "start() first"
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def ready(self) -> None:
        """Return once a cold start (the first, or the first after an idle stop) is over, at
        once otherwise: a stream's first final waits for the child that its stream started
        (bounded by its caller), while a restart after a death never holds a final."""
        task = self._start_task
        if task is not None and self._cold:
            with contextlib.suppress(Exception):
                await asyncio.shield(task)

    def _begin_start(self, cold: bool = True) -> None:
        if self._start_task is not None or self._executor is None:
            return
        self._cold = cold
        if not installed():
            self._state, self._reason = (
                "stopped",
                ("live speakers need the diarize extra: pip install 'qwen3-asr-server[diarize]'"),
            )
            return
        self._state, self._reason = "starting", None
        self._start_task = asyncio.create_task(self._start(), name="voices-start")

    async def _start(self) -> None:
        try:
            await self._call(self._child.load)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failures += 1
            reason = f"the speaker embedding process could not start: {str(exc).rstrip('.')}"
            logger.error("live speakers: {}", reason)
            self._died(f"{reason}; retrying")
        else:
            self._state = "ready"
        finally:
            self._start_task = None

    async def _wait_started(self) -> None:
        if self._state == "stopped":
            self._begin_start()
        if self._start_task is not None:
            await asyncio.shield(self._start_task)
        if self._state != "ready":
            raise SpeakersUnavailable(self._reason or f"live speakers are {self._state}")

    def _broken(self, exc: Exception) -> SpeakersUnavailable:
        """A call failed: the child died (restart in the background) or answered an error."""
        if self._child.pid is None:
            how = self._child.last_exit or "unknown exit"
            self._failures += 1
            self._died(f"the speaker embedding process died ({how}); restarting")
            return SpeakersUnavailable(self._reason or how)
        return SpeakersUnavailable(f"the speaker embedding failed: {type(exc).__name__}: {exc}")

    def _died(self, reason: str) -> None:
        """The child is gone: say why, and start a fresh one after the backoff."""
        self._state, self._reason = "exited", reason
        backoff = min(MAX_BACKOFF, BACKOFF * 2 ** min(max(self._failures - 1, 0), 16))
        if self._restart_task is None:
            self._restart_task = asyncio.create_task(self._restart(backoff), name="voices-restart")

    async def _restart(self, backoff: float) -> None:
        try:
            await asyncio.sleep(backoff)
        finally:
            self._restart_task = None
        if self._state == "exited":
            self._state = "stopped"
            self._begin_start(cold=False)

    def _check(self) -> None:
        """A ready child that died while nothing was sent to it (never blocks)."""
        if self._state != "ready" or self._pump_task is not None:
            return
        how = self._child.exited()
        if how is not None:
            self._failures += 1  # the log says it as the fresh child's start reaps this one
            self._died(f"the speaker embedding process died ({how}); restarting")

    async def _watch(self) -> None:
        """Deaths between calls, and the idle unload."""
        while True:
            await asyncio.sleep(TICK if self.idle_timeout <= 0 else min(TICK, self.idle_timeout))
            self._check()
            idle = time.monotonic() - self._last_used
            if (
                self.idle_timeout > 0
                and self._state == "ready"
                and self._streams == 0
                and self._pump_task is None
                and idle >= self.idle_timeout
            ):
                logger.info("live speakers: idle for {:.0f} s, stopping their process", idle)
                self._state = "stopped"
                try:
                    await self._call(self._child.unload)
                except Exception:  # the watchdog goes on whatever a stop did
                    logger.exception("live speakers: stopping their process failed")

    def status(self) -> VoicesStatus:
        pid = self._child.pid if self._state != "stopped" else None
        state, reason = self._state, self._reason
        overdue = self._overdue_at
        if state == "ready" and overdue is not None and time.monotonic() > overdue:
            late = time.monotonic() - overdue
            state = "not_answering"
            reason = (
                f"the speaker embedding process has not answered for {late:.0f} s past its "
                "expected time (hung or stopped?); it is killed at its deadline"
            )
        return VoicesStatus(
            pid=pid,
            state=state,
            restarts=self._child.restarts,
            streams=self._streams,
            missing=self._missing,
            last_missing_reason=self._last_missing,
            embedded=self.embedded,
            messages=self.messages,
            cpu_seconds=cpu_seconds(pid),
            reason=reason,
        )


def cpu_seconds(pid: int | None) -> float:
    """A process's CPU time so far, user plus system (0 when there is none)."""
    if pid is None:
        return 0.0
    import psutil

    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return round(times.user + times.system, 3)
