"""PriorityScheduler unit tests (plain functions stand in for the engine)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable

import pytest

from qwen3_asr_server.api.error_table import http_headers, http_status
from qwen3_asr_server.errors import QueueFullError, RequestTimeoutError
from qwen3_asr_server.runtime.scheduler import (
    BATCH,
    PARTIAL,
    REALTIME,
    BatchSpec,
    PriorityScheduler,
)


@pytest.fixture
async def scheduler() -> AsyncIterator[PriorityScheduler]:
    sched = PriorityScheduler(max_queue=8)
    sched.start()
    yield sched
    await asyncio.to_thread(sched.stop)


def blocker() -> tuple[threading.Event, threading.Event]:
    started, release = threading.Event(), threading.Event()
    return started, release


async def occupy(sched: PriorityScheduler) -> tuple[asyncio.Task[str], threading.Event]:
    """Put a job on the worker that runs until released."""
    started, release = blocker()

    def hold() -> str:
        started.set()
        release.wait(10)
        return "held"

    task = asyncio.create_task(sched.submit(hold))
    await asyncio.to_thread(started.wait, 5)
    return task, release


async def until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait for `condition` (a queued job, a finished one), not for a guessed time."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the condition"
        await asyncio.sleep(0.005)


async def test_runs_a_job_and_returns_its_result(scheduler: PriorityScheduler) -> None:
    assert await scheduler.submit(lambda: 2 + 2) == 4


async def test_realtime_before_batch_and_fifo_within_priority(
    scheduler: PriorityScheduler,
) -> None:
    holder, release = await occupy(scheduler)
    order: list[str] = []
    jobs = [("b1", BATCH), ("r1", REALTIME), ("b2", BATCH), ("r2", REALTIME), ("b3", BATCH)]
    tasks = []
    for name, prio in jobs:
        tasks.append(
            asyncio.create_task(scheduler.submit(lambda n=name: order.append(n), priority=prio))
        )
        await until(lambda: scheduler.depth == len(tasks))  # arrival order: submission order
    assert scheduler.depth == 5
    release.set()
    await asyncio.gather(holder, *tasks)
    assert order == ["r1", "r2", "b1", "b2", "b3"]


async def test_cancel_before_start_skips_the_job(scheduler: PriorityScheduler) -> None:
    holder, release = await occupy(scheduler)
    ran: list[str] = []
    task = asyncio.create_task(scheduler.submit(lambda: ran.append("cancelled job")))
    await until(lambda: scheduler.depth == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert scheduler.depth == 0  # removed from the queue, not just flagged
    release.set()
    await holder
    assert await scheduler.submit(lambda: "after") == "after"
    assert ran == []


async def test_cancel_after_start_drops_the_result_and_worker_survives(
    scheduler: PriorityScheduler,
) -> None:
    started, release = blocker()
    finished = threading.Event()

    def slow() -> str:
        started.set()
        release.wait(10)
        finished.set()
        return "nobody is listening"

    task = asyncio.create_task(scheduler.submit(slow))
    await asyncio.to_thread(started.wait, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()
    await asyncio.to_thread(finished.wait, 5)
    assert await scheduler.submit(lambda: "next") == "next"


async def test_timeout_then_next_request_succeeds(scheduler: PriorityScheduler) -> None:
    """The seed's queue died here: the caller's future was cancelled by the timeout, the
    worker then called set_result on it, InvalidStateError killed the worker, and every
    later request hung. Ours must answer 504 and keep serving."""

    release, finished = threading.Event(), threading.Event()

    def slow() -> str:
        release.wait(30)  # runs until the caller has timed out, however slow the machine
        finished.set()
        return "late"

    with pytest.raises(RequestTimeoutError) as info:
        await scheduler.submit(slow, timeout=0.1)
    assert http_status(info.value) == 504
    release.set()  # the slow job finishes and tries to deliver to nobody
    assert await asyncio.to_thread(finished.wait, 30)
    await until(lambda: not scheduler.busy)
    assert await asyncio.wait_for(scheduler.submit(lambda: "alive", timeout=5), 5) == "alive"
    assert scheduler.completed >= 2


async def test_exception_reaches_caller_and_worker_survives(
    scheduler: PriorityScheduler,
) -> None:
    def boom() -> None:
        raise RuntimeError("engine exploded")

    with pytest.raises(RuntimeError, match="engine exploded"):
        await scheduler.submit(boom)

    def base_exit() -> None:
        raise SystemExit(3)  # not an Exception subclass

    with pytest.raises(RuntimeError):
        await scheduler.submit(base_exit)
    assert await scheduler.submit(lambda: "still here") == "still here"


async def test_full_queue_is_rejected_with_503() -> None:
    sched = PriorityScheduler(max_queue=2)
    sched.start()
    try:
        holder, release = await occupy(sched)
        waiting = [asyncio.create_task(sched.submit(lambda: 1)) for _ in range(2)]
        await until(lambda: sched.depth == 2)
        with pytest.raises(QueueFullError) as info:
            await sched.submit(lambda: 1)
        assert http_status(info.value) == 503
        assert http_headers(info.value)["Retry-After"] == "1"
        release.set()
        assert await asyncio.gather(*waiting) == [1, 1]
        await holder
    finally:
        await asyncio.to_thread(sched.stop)


async def test_admission_is_checked_once_and_admitted_jobs_are_never_refused() -> None:
    """MAX_QUEUE is admission control: `admit()` refuses new work while waiting jobs plus
    admitted work that has queued nothing yet reach it, but jobs of admitted work (an
    upload's next segment, a stream's final) are queued whatever the depth. Unadmitted jobs
    (partials) are refused only by the jobs that would run before them."""
    sched = PriorityScheduler(max_queue=3)
    sched.start()
    try:
        holder, release = await occupy(sched)
        first = sched.admit()
        segments = [asyncio.create_task(sched.submit(lambda: 1, admitted=True)) for _ in range(4)]
        while sched.depth < 4:
            await asyncio.sleep(0.01)
        with pytest.raises(QueueFullError):
            sched.admit()
        # four queued upload segments do not refuse a partial: it runs before them
        partial = asyncio.create_task(sched.submit(lambda: 3, priority=PARTIAL))
        finals = [
            asyncio.create_task(sched.submit(lambda: 2, priority=REALTIME, admitted=True))
            for _ in range(3)
        ]
        while sched.depth < 8:
            await asyncio.sleep(0.01)
        with pytest.raises(QueueFullError):  # three finals wait: the partial would wait too
            await sched.submit(lambda: 3, priority=PARTIAL)
        release.set()
        assert await asyncio.gather(*segments, *finals, partial) == [1, 1, 1, 1, 2, 2, 2, 3]
        await holder
        first.release()  # it arrived with its first job: releasing it changes nothing
        others = [sched.admit() for _ in range(3)]
        with pytest.raises(QueueFullError):  # the queue is empty, but 3 uploads are arriving
            sched.admit()
        others[0].release()
        others[0].release()  # counts once
        others.append(sched.admit())
        with pytest.raises(QueueFullError):
            sched.admit()
    finally:
        await asyncio.to_thread(sched.stop)


async def test_a_burst_of_uploads_cannot_all_pass_an_empty_queue() -> None:
    """Uploads queue nothing until they are decoded: admission counts them from `admit()`
    until their first job is queued (or they end), so a burst cannot all pass an empty
    queue."""
    sched = PriorityScheduler(max_queue=4)
    sched.start()
    try:
        admitted = []
        refused = 0
        for _ in range(10):
            try:
                admitted.append(sched.admit())
            except QueueFullError:
                refused += 1
        assert len(admitted) == 4 and refused == 6
        admitted.pop().release()
        admitted.append(sched.admit())
    finally:
        await asyncio.to_thread(sched.stop)


async def test_stop_fails_pending_jobs() -> None:
    sched = PriorityScheduler(max_queue=4)
    sched.start()
    holder, release = await occupy(sched)
    pending = asyncio.create_task(sched.submit(lambda: "never"))
    await until(lambda: sched.depth == 1)
    stopper = asyncio.create_task(asyncio.to_thread(sched.stop))
    await until(pending.done)  # failed by stop() while the held job still runs
    assert not stopper.done()  # stop() waits for the running job
    release.set()
    await stopper
    with pytest.raises(Exception, match="shutting down"):
        await pending
    await holder


def spec(key: str, item: int, calls: list[list[int]], fail: bool = False) -> BatchSpec:
    def run_many(items: list[int]) -> list[int]:
        calls.append(list(items))
        if fail and len(items) > 1:
            raise RuntimeError("batch exploded")
        return [i * 10 for i in items]

    return BatchSpec(key=key, item=item, run_many=run_many)


async def test_waiting_jobs_with_the_same_key_run_as_one_batch() -> None:
    sched = PriorityScheduler(max_queue=16, max_batch=3)
    sched.start()
    try:
        holder, release = await occupy(sched)
        calls: list[list[int]] = []
        tasks = [
            asyncio.create_task(
                sched.submit(lambda i=i: i * 10, batch=spec("en" if i != 2 else "fr", i, calls))
            )
            for i in range(6)
        ]
        await until(lambda: sched.depth == 6)
        release.set()
        assert await asyncio.gather(*tasks) == [0, 10, 20, 30, 40, 50]
        await holder
        # FIFO within the key, at most 3 per batch; the odd key ran alone through its fn
        assert calls == [[0, 1, 3], [4, 5]]
        assert sched.batches == 2
    finally:
        await asyncio.to_thread(sched.stop)


async def test_realtime_jobs_are_not_batched_with_batch_jobs() -> None:
    sched = PriorityScheduler(max_queue=16, max_batch=4, realtime_quiet=0)
    sched.start()
    try:
        holder, release = await occupy(sched)
        calls: list[list[int]] = []
        batch = [
            asyncio.create_task(sched.submit(lambda: 0, batch=spec("k", i, calls))) for i in (1, 2)
        ]
        rt = asyncio.create_task(
            sched.submit(lambda: calls.append([9]), priority=REALTIME, batch=spec("k", 9, calls))
        )
        await until(lambda: sched.depth == 3)
        release.set()
        await asyncio.gather(holder, rt, *batch)
        assert calls == [[9], [1, 2]]  # realtime first, alone
    finally:
        await asyncio.to_thread(sched.stop)


async def test_a_failed_batch_is_retried_one_by_one() -> None:
    sched = PriorityScheduler(max_queue=16, max_batch=4)
    sched.start()
    try:
        holder, release = await occupy(sched)
        calls: list[list[int]] = []

        def single(i: int) -> int:
            if i == 2:
                raise ValueError("bad input 2")
            return i * 10

        tasks = [
            asyncio.create_task(
                sched.submit(lambda i=i: single(i), batch=spec("k", i, calls, fail=True))
            )
            for i in range(1, 4)
        ]
        await until(lambda: sched.depth == 3)
        release.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        await holder
        assert results[0] == 10 and results[2] == 30  # neighbours are not lost
        assert isinstance(results[1], ValueError)
    finally:
        await asyncio.to_thread(sched.stop)


async def queue_in_order(
    sched: PriorityScheduler, jobs: list[tuple[str, int]]
) -> tuple[list[str], list[asyncio.Task[None]], asyncio.Task[str], threading.Event]:
    holder, release = await occupy(sched)
    order: list[str] = []
    tasks = []
    for name, prio in jobs:
        tasks.append(
            asyncio.create_task(sched.submit(lambda n=name: order.append(n), priority=prio))
        )
        await until(lambda: sched.depth == len(tasks))
    return order, tasks, holder, release


async def test_finals_then_partials_then_uploads() -> None:
    sched = PriorityScheduler(max_queue=8, batch_max_wait=60)
    sched.start()
    try:
        jobs = [("b1", BATCH), ("p1", PARTIAL), ("f1", REALTIME), ("p2", PARTIAL), ("f2", REALTIME)]
        order, tasks, holder, release = await queue_in_order(sched, jobs)
        release.set()
        await asyncio.gather(holder, *tasks)
        assert order == ["f1", "f2", "p1", "p2", "b1"]
    finally:
        await asyncio.to_thread(sched.stop)


async def test_an_upload_that_waited_goes_before_partials_but_not_finals() -> None:
    """Partials from many streams must not starve uploads: past batch_max_wait, a batch job
    runs before any partial; finals still come first."""
    sched = PriorityScheduler(max_queue=8, batch_max_wait=0.05)
    sched.start()
    try:
        jobs = [("b1", BATCH), ("p1", PARTIAL), ("p2", PARTIAL), ("f1", REALTIME)]
        order, tasks, holder, release = await queue_in_order(sched, jobs)
        await asyncio.sleep(0.1)  # b1 has now waited longer than batch_max_wait
        release.set()
        await asyncio.gather(holder, *tasks)
        assert order == ["f1", "b1", "p1", "p2"]
    finally:
        await asyncio.to_thread(sched.stop)


async def test_should_stop_tells_a_running_job_its_caller_left(
    scheduler: PriorityScheduler,
) -> None:
    noticed = threading.Event()

    def runaway() -> str:
        deadline = time.monotonic() + 120  # far past the wait below: it must be told
        while time.monotonic() < deadline:
            if scheduler.should_stop():
                noticed.set()
                return "stopped"
            time.sleep(0.005)
        return "ran to the end"

    with pytest.raises(RequestTimeoutError):
        await scheduler.submit(runaway, timeout=0.2)
    assert await asyncio.to_thread(noticed.wait, 60)  # set only when should_stop() said so
    assert not scheduler.should_stop()  # outside a job: nothing to stop
    assert await scheduler.submit(lambda: "next") == "next"


async def test_should_stop_waits_for_every_member_of_a_batch() -> None:
    sched = PriorityScheduler(max_queue=8, max_batch=4)
    sched.start()
    seen: list[bool] = []
    release = threading.Event()

    def run_many(items: list[int]) -> list[int]:
        release.wait(5)
        seen.append(sched.should_stop())
        return items

    try:
        holder, hold_release = await occupy(sched)
        spec = [BatchSpec("k", i, run_many) for i in range(2)]
        a = asyncio.create_task(sched.submit(lambda: 0, batch=spec[0]))
        b = asyncio.create_task(sched.submit(lambda: 1, batch=spec[1]))
        await until(lambda: sched.depth == 2)
        hold_release.set()
        await holder
        await until(lambda: sched.depth == 0 and sched.busy)  # both run as one batch
        a.cancel()  # one member left: the other still wants its result
        with pytest.raises(asyncio.CancelledError):
            await a
        release.set()
        assert await b == 1
        assert seen == [False]
    finally:
        await asyncio.to_thread(sched.stop)


async def test_a_batch_whose_callers_all_left_is_not_rerun_one_by_one() -> None:
    sched = PriorityScheduler(max_queue=8, max_batch=4)
    sched.start()
    calls: list[str] = []
    release = threading.Event()

    def run_many(items: list[int]) -> list[int]:
        calls.append(f"batch of {len(items)}")
        release.wait(5)
        if sched.should_stop():  # what the engines do: stop, and say so
            raise RuntimeError("stopped")
        return items

    def single(i: int) -> int:
        calls.append(f"single {i}")
        return i

    try:
        holder, hold_release = await occupy(sched)
        tasks = [
            asyncio.create_task(
                sched.submit(lambda i=i: single(i), batch=BatchSpec("k", i, run_many), timeout=0.3)
            )
            for i in range(4)
        ]
        await until(lambda: sched.depth == 4)
        hold_release.set()
        await holder
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, RequestTimeoutError) for r in results)
        release.set()
        assert await sched.submit(lambda: "next") == "next"
        assert calls == ["batch of 4"]  # no full decode per job after the stop
    finally:
        await asyncio.to_thread(sched.stop)


async def test_uploads_are_not_batched_while_streams_are_live() -> None:
    """A batch would hold the engine several times as long as one job, and a streaming
    final cannot interrupt it: within `realtime_quiet` of a real-time job, batch jobs run
    one by one; after it they batch again."""
    # a quiet time no busy machine outlasts while the first three run; shortened after them
    sched = PriorityScheduler(max_queue=16, max_batch=4, realtime_quiet=60)
    sched.start()
    try:
        await sched.submit(lambda: None, priority=REALTIME)
        holder, release = await occupy(sched)
        calls: list[list[int]] = []
        tasks = [
            asyncio.create_task(sched.submit(lambda i=i: i * 10, batch=spec("k", i, calls)))
            for i in range(3)
        ]
        await until(lambda: sched.depth == 3)
        release.set()
        assert await asyncio.gather(*tasks) == [0, 10, 20]
        await holder
        assert calls == [] and sched.batches == 0  # each ran through its own fn
        sched.realtime_quiet = 0.3
        await until(lambda: not sched.realtime_recent())  # the quiet time has passed
        holder, release = await occupy(sched)
        tasks = [
            asyncio.create_task(sched.submit(lambda: -1, batch=spec("k", i, calls)))
            for i in range(3)
        ]
        await until(lambda: sched.depth == 3)
        release.set()
        assert await asyncio.gather(*tasks) == [0, 10, 20]
        await holder
        assert calls == [[0, 1, 2]]
    finally:
        await asyncio.to_thread(sched.stop)


async def test_an_idle_worker_keeps_nothing_of_the_last_job(scheduler: PriorityScheduler) -> None:
    """An upload's request holds its whole decoded audio: once its job is done (or
    cancelled), the waiting worker thread must not keep it alive (issue 19 review)."""
    import gc
    import weakref

    class Audio:
        pass

    audio = Audio()
    ref = weakref.ref(audio)

    def job(held: Audio = audio) -> str:
        return type(held).__name__

    assert await scheduler.submit(job) == "Audio"
    del audio, job

    def freed() -> bool:  # once the worker is back waiting for the next job
        gc.collect()
        return ref() is None

    await until(freed)
