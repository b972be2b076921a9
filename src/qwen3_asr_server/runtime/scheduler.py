"""One priority queue, one inference thread (or `workers` threads for remote backends).

Jobs are ordered by (priority, arrival): streaming finals (REALTIME) before streaming
partials (PARTIAL) before uploads (BATCH), FIFO within a priority. Partials never starve
uploads: a batch job that has waited `batch_max_wait` seconds runs before any partial (still
after finals). A caller that times out or goes away cancels its job: a job that has not
started is removed from the queue; a running job's result is dropped, and the engine can
poll `should_stop()` on the worker thread to end its generation early. The worker thread
survives every exception, and delivering a result to a caller that is gone is never an
error (the seed's queue died exactly there, see DESIGN.md §4).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from loguru import logger

from ..errors import QueueFullError, RequestTimeoutError, UnavailableError
from .jobs import ADMISSION, BATCH, PARTIAL, REALTIME, Admission, BatchSpec, Job, send
from .queue import JobQueue
from .rows import JobRows, Taken, reserve

__all__ = ["BATCH", "PARTIAL", "REALTIME", "Admission", "BatchSpec", "PriorityScheduler"]
T = TypeVar("T")
GATHER_S = 0.004  # seconds a step loop's take waits for arriving uploads to join it at once


class PriorityScheduler:
    def __init__(
        self,
        max_queue: int,
        max_batch: int = 1,
        name: str = "inference",
        batch_max_wait: float = 1.0,
        on_start: Callable[[int, float], None] | None = None,
        on_batch: Callable[[int, int], None] | None = None,
        workers: int = 1,
        realtime_quiet: float = 5.0,
        gather: float = GATHER_S,
    ) -> None:
        self.max_queue = max_queue
        self.workers = max(1, workers)  # threads pulling from the heap: engine calls at once
        # Uploads are batched only when no real-time job came for this long: a batch runs
        # several times as long as one job, and a streaming final cannot interrupt it.
        self.realtime_quiet = realtime_quiet
        self._last_realtime = -realtime_quiet
        self.max_batch = max_batch
        self.gather = gather
        self._on_start = on_start  # (priority, seconds waited) as each job starts: metrics
        self._on_batch = on_batch  # (most urgent priority, jobs) per engine call or step
        self._local = threading.local()  # the group of jobs running on this worker thread
        self._name = name
        self._queue = JobQueue(batch_max_wait)
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._running = 0
        self._arriving = 0  # admitted work (uploads) that has not queued a job yet
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self.completed = 0
        self.failed = 0
        self.batches = 0  # engine calls that ran more than one job
        self.gathers = 0  # times a step loop's take waited for arriving work (`gather`)

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        if self._threads:
            return
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{self._name}-{i}", daemon=True)
            for i in range(self.workers)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Refuse new jobs, fail the pending ones, wait for the running one to finish."""
        with self._cond:
            self._stopping = True
            pending = self._queue.drain()
            self._cond.notify_all()
        for job in pending:
            job.state = "cancelled"
            send(job, None, UnavailableError("The server is shutting down.", code="shutting_down"))
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads = []

    # -- state -------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        """Jobs waiting, not counting the one running."""
        with self._cond:
            return len(self._queue)

    @property
    def arriving(self) -> int:
        """Admitted work that has not queued a job yet (uploads being decoded)."""
        with self._cond:
            return self._arriving

    @property
    def busy(self) -> bool:
        return self._running > 0

    def admit(self) -> Admission:
        """Admission control, once when new work (an upload, before it is decoded) first
        asks: QueueFullError (503) while waiting jobs plus admitted work not queued yet
        reach `max_queue`. Admitted work submits with `admitted=True`, never refused later.
        The admission is the calling task's context's: its first admitted job (or the
        request's end, `release()`) marks it arrived."""
        with self._cond:
            if self._stopping or not self._threads:
                raise UnavailableError("The server is shutting down.", code="shutting_down")
            if len(self._queue) + self._arriving >= self.max_queue:
                raise QueueFullError()
            self._arriving += 1
        admission = Admission(self._arrived)
        ADMISSION.set(admission)
        return admission

    def _arrived(self) -> None:
        with self._cond:
            self._arriving -= 1
            self._cond.notify_all()  # (a take gathering arrivals stops waiting at none)

    def realtime_recent(self) -> bool:
        """A streaming job was submitted within `realtime_quiet` seconds."""
        return time.monotonic() - self._last_realtime < self.realtime_quiet

    def should_stop(self) -> bool:
        """On the worker thread, inside a job: every caller of the running job (or batch)
        has gone or timed out, so its result would be dropped. Engines poll this to end a
        generation early."""
        group: list[Job[Any]] = getattr(self._local, "group", [])
        return bool(group) and all(job.state == "cancelled" for job in group)

    # -- submit ------------------------------------------------------------------------
    async def submit(
        self,
        fn: Callable[[], T],
        *,
        priority: int = BATCH,
        timeout: float | None = None,
        batch: BatchSpec | None = None,
        admitted: bool = False,
    ) -> T:
        """Run `fn` on the inference thread and return its result.

        With `batch`, the worker may run it in one `run_many` call with waiting jobs of the
        same key and priority (up to `max_batch`). `admitted` (work past `admit()`): queued
        whatever the depth; otherwise QueueFullError (503) at `max_queue` waiting jobs.
        RequestTimeoutError (504) after `timeout` s. Cancelling the awaiting task cancels
        the job."""
        loop = asyncio.get_running_loop()
        job: Job[T] = Job(priority, next(self._seq), fn, loop.create_future(), loop, batch=batch)
        with self._cond:
            if self._stopping or not self._threads:
                raise UnavailableError("The server is shutting down.", code="shutting_down")
            # unadmitted jobs (partials) count only the jobs that run before or with them:
            # queued uploads do not delay a partial, so they do not refuse it either
            if not admitted and self._queue.ahead(priority) >= self.max_queue:
                raise QueueFullError()
            if priority < BATCH:
                self._last_realtime = time.monotonic()
            self._queue.push(job)
            self._cond.notify()
        if admitted:
            admission = ADMISSION.get()
            if admission is not None:
                admission.arrived()  # its job is in the heap now: counted there
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

    def _cancel(self, job: Job[Any]) -> None:
        with self._cond:
            if job.state == "pending":
                self._queue.remove(job)
            if job.state in ("pending", "running"):
                job.state = "cancelled"
        job.future.cancel()

    # -- worker ------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if self._stopping and not self._queue:
                    return
                job = self._queue.pop(time.monotonic())
                if job.state != "pending":
                    del job  # a cancelled job's request (its audio) is not kept while idle
                    continue
                steps = job.batch is not None and job.batch.steps is not None
                group = [job] if steps else [job, *self._partners(job)]
                for member in group:
                    member.state = "running"
                self._running += len(group)
            if steps:
                self._run_steps(job)
                del job, group, member
                continue
            self._local.group = group
            for member in group:
                self._started(member)
            if self._on_batch is not None:
                self._on_batch(job.priority, len(group))
            try:
                if len(group) == 1:
                    self._run_one(job)
                else:
                    self._run_group(group)
            finally:
                self._local.group = []
            with self._cond:
                self._running -= len(group)
            del job, group, member  # nor the last one's, while this thread waits for the next

    def _started(self, job: Job[Any]) -> None:
        if self._on_start is not None and not job.displaced:
            self._on_start(job.priority, time.monotonic() - job.queued_at)

    def _run_steps(self, first: Job[Any]) -> None:
        """An engine that decodes step by step: waiting jobs of the same key join its rows
        between steps (`_take_rows`), and each is answered as its row ends."""
        assert first.batch is not None and first.batch.steps is not None
        rows = JobRows(first, self._take_rows, self._row_done, self._started, self._on_batch)
        try:
            first.context.run(first.batch.steps, rows)
        except BaseException as exc:  # the worker must outlive any engine failure
            logger.opt(exception=exc).error("the step loop failed")
            rows.fail(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
        rows.fail(RuntimeError("the engine left this job unanswered"))

    def _take_rows(self, key: Hashable, free: int, slots: int, given: int) -> Taken:
        """Waiting jobs that join a step loop of `key` in its `free` slots (`given` already
        to its first job), and the finals of `key` left waiting for a slot. While streams
        are live, `reserve(slots)` slots are for finals only. While uploads are arriving, a
        take into an idle loop (no row in flight: none is held up) that got rows waits up to
        `gather` seconds for more: one prefill, not several."""
        with self._cond:
            if self._stopping:
                return [], 0
            keep = reserve(slots) if self.realtime_recent() else 0
            room, deadline, waits = free - given, time.monotonic() + self.gather, self.gathers
            taken = self._running_now(self._queue.joiners(key, room, time.monotonic(), keep))
            idle = free == slots
            while idle and (given or taken) and room - len(taken) > keep and self._arriving:
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping:
                    break
                self.gathers += 1
                self._cond.wait(left)
                more = self._queue.joiners(key, room - len(taken), time.monotonic(), keep)
                taken += self._running_now(more)
            if self.gathers > waits and self._queue:
                self._cond.notify()  # (another worker may have missed its wake-up meanwhile)
            return taken, self._queue.finals(key) if len(taken) == room else 0

    def _running_now(self, jobs: list[Job[Any]]) -> list[Job[Any]]:
        """Jobs just taken out of the queue: running (a caller who leaves now is seen)."""
        for job in jobs:
            job.state = "running"
        self._running += len(jobs)
        return jobs

    def _row_done(self, job: Job[Any], result: Any, error: Exception | None, again: bool) -> None:
        """`again`: a partial's row left for a final; its job waits again, in its old place
        (its request built anew when it joins), unless its caller has gone meanwhile."""
        with self._cond:
            if again and job.state == "running" and not self._stopping:
                self._running -= 1
                self._queue.requeue(job)
                return self._cond.notify()
        if again:  # not waiting again: shutting down (or its caller has gone: dropped)
            error = UnavailableError("The server is shutting down.", code="shutting_down")
        self._finish(job, result, error)
        with self._cond:
            self._running -= 1

    def _partners(self, first: Job[Any]) -> list[Job[Any]]:
        """Waiting jobs that may share an engine call with `first` (lock held)."""
        if self.max_batch < 2 or (first.priority == BATCH and self.realtime_recent()):
            return []  # (streams are live: keep each upload job short)
        return self._queue.partners(first, self.max_batch - 1)

    def _run_one(self, job: Job[Any]) -> None:
        try:
            result = job.context.run(job.fn)
        except BaseException as exc:  # the worker must outlive any job
            self._finish(job, None, exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
        else:
            self._finish(job, result, None)

    def _run_group(self, group: list[Job[Any]]) -> None:
        spec = group[0].batch
        assert spec is not None
        try:
            items = [j.batch.item for j in group if j.batch is not None]
            results = group[0].context.run(spec.run_many, items)
            if len(results) != len(group):
                raise RuntimeError(f"run_many returned {len(results)} results for {len(group)}")
        except BaseException as exc:
            if self.should_stop():  # every caller left: the engine stopped, nothing to redo
                for job in group:
                    self._finish(job, None, exc if isinstance(exc, Exception) else None)
                return
            # One bad input must not fail its neighbours: retry each job on its own, except
            # those whose caller has gone meanwhile.
            logger.warning("a batch of {} failed ({!r}); running them one by one", len(group), exc)
            for job in group:
                if job.state == "cancelled":
                    self._finish(job, None, None)
                    continue
                self._local.group = [job]
                self._run_one(job)
            return
        self.batches += 1
        for job, result in zip(group, results, strict=True):
            self._finish(job, result, None)

    def _finish(self, job: Job[Any], result: Any, error: BaseException | None) -> None:
        if error is None:
            self.completed += 1
        else:
            self.failed += 1
        with self._cond:
            dropped = job.state == "cancelled"
            job.state = "done"
        if dropped:
            logger.debug("dropping the result of a cancelled job")
        else:
            send(job, result, error)
