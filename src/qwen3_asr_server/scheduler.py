"""One priority queue, one inference thread.

Jobs are ordered by (priority, arrival): real-time (0) before batch (1), FIFO within a
priority. A caller that times out or goes away cancels its job: a job that has not started
is removed from the queue, a running job's result is dropped. The worker thread survives
every exception, and delivering a result to a caller that is gone is never an error (the
seed's queue died exactly there, see DESIGN.md §4).
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from loguru import logger

from .errors import QueueFullError, RequestTimeoutError, ServiceUnavailableError

T = TypeVar("T")

REALTIME = 0
BATCH = 1


@dataclass(order=True)
class _Job(Generic[T]):
    priority: int
    seq: int
    fn: Callable[[], T] = field(compare=False)
    future: asyncio.Future[T] = field(compare=False)
    loop: asyncio.AbstractEventLoop = field(compare=False)
    # The caller's context (request id for the logs) travels with the job to the thread.
    context: contextvars.Context = field(default_factory=contextvars.copy_context, compare=False)
    state: str = field(default="pending", compare=False)  # pending|running|done|cancelled


def _deliver(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """Runs on the event loop. The caller may have gone: then there is nobody to tell."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class PriorityScheduler:
    def __init__(self, max_queue: int, name: str = "inference") -> None:
        self.max_queue = max_queue
        self._name = name
        self._heap: list[_Job[Any]] = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._running: _Job[Any] | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.completed = 0
        self.failed = 0

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Refuse new jobs, fail the pending ones, wait for the running one to finish."""
        with self._cond:
            self._stopping = True
            pending, self._heap = self._heap, []
            self._cond.notify_all()
        for job in pending:
            job.state = "cancelled"
            err = ServiceUnavailableError("The server is shutting down.", code="shutting_down")
            job.loop.call_soon_threadsafe(_deliver, job.future, None, err)
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    # -- state -------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        """Jobs waiting, not counting the one running."""
        with self._cond:
            return len(self._heap)

    @property
    def busy(self) -> bool:
        return self._running is not None

    # -- submit ------------------------------------------------------------------------
    async def submit(
        self, fn: Callable[[], T], *, priority: int = BATCH, timeout: float | None = None
    ) -> T:
        """Run `fn` on the inference thread and return its result.

        Raises QueueFullError (503) when the queue is full and RequestTimeoutError (504)
        when `timeout` seconds pass first. Cancelling the awaiting task cancels the job.
        """
        loop = asyncio.get_running_loop()
        job: _Job[T] = _Job(priority, next(self._seq), fn, loop.create_future(), loop)
        with self._cond:
            if self._stopping or self._thread is None:
                raise ServiceUnavailableError("The server is shutting down.", code="shutting_down")
            if len(self._heap) >= self.max_queue:
                raise QueueFullError()
            heapq.heappush(self._heap, job)
            self._cond.notify()
        try:
            return await asyncio.wait_for(asyncio.shield(job.future), timeout)
        except TimeoutError:
            self._cancel(job)
            raise RequestTimeoutError(
                f"The request did not finish within {timeout:g} s (REQUEST_TIMEOUT)."
            ) from None
        except asyncio.CancelledError:
            self._cancel(job)
            raise

    def _cancel(self, job: _Job[Any]) -> None:
        with self._cond:
            if job.state == "pending":
                try:
                    self._heap.remove(job)
                    heapq.heapify(self._heap)
                except ValueError:
                    pass
            if job.state in ("pending", "running"):
                job.state = "cancelled"
        job.future.cancel()

    # -- worker ------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._heap and not self._stopping:
                    self._cond.wait()
                if self._stopping and not self._heap:
                    return
                job = heapq.heappop(self._heap)
                if job.state != "pending":
                    continue
                job.state = "running"
                self._running = job
            self._run(job)

    def _run(self, job: _Job[Any]) -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            result = job.context.run(job.fn)
            self.completed += 1
        except BaseException as exc:  # the worker must outlive any job
            self.failed += 1
            error = exc if isinstance(exc, Exception) else RuntimeError(repr(exc))
        with self._cond:
            self._running = None
            dropped = job.state == "cancelled"
            job.state = "done"
        if dropped:
            logger.debug("dropping the result of a cancelled job")
            return
        try:
            job.loop.call_soon_threadsafe(_deliver, job.future, result, error)
        except RuntimeError:  # the caller's event loop is closed
            logger.debug("event loop closed before the result could be delivered")
