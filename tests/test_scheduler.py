"""PriorityScheduler unit tests (plain functions stand in for the engine)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator

import pytest

from qwen3_asr_server.errors import QueueFullError, RequestTimeoutError
from qwen3_asr_server.scheduler import BATCH, REALTIME, PriorityScheduler


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
        await asyncio.sleep(0.01)  # arrival order is submission order
    assert scheduler.depth == 5
    release.set()
    await asyncio.gather(holder, *tasks)
    assert order == ["r1", "r2", "b1", "b2", "b3"]


async def test_cancel_before_start_skips_the_job(scheduler: PriorityScheduler) -> None:
    holder, release = await occupy(scheduler)
    ran: list[str] = []
    task = asyncio.create_task(scheduler.submit(lambda: ran.append("cancelled job")))
    await asyncio.sleep(0.05)
    assert scheduler.depth == 1
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

    def slow() -> str:
        time.sleep(0.5)
        return "late"

    with pytest.raises(RequestTimeoutError) as info:
        await scheduler.submit(slow, timeout=0.1)
    assert info.value.status == 504
    await asyncio.sleep(0.6)  # the slow job finishes and tries to deliver to nobody
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
        await asyncio.sleep(0.05)
        with pytest.raises(QueueFullError) as info:
            await sched.submit(lambda: 1)
        assert info.value.status == 503
        assert info.value.headers["Retry-After"]
        release.set()
        assert await asyncio.gather(*waiting) == [1, 1]
        await holder
    finally:
        await asyncio.to_thread(sched.stop)


async def test_stop_fails_pending_jobs() -> None:
    sched = PriorityScheduler(max_queue=4)
    sched.start()
    holder, release = await occupy(sched)
    pending = asyncio.create_task(sched.submit(lambda: "never"))
    await asyncio.sleep(0.05)
    stopper = asyncio.create_task(asyncio.to_thread(sched.stop))
    await asyncio.sleep(0.05)
    release.set()
    await stopper
    with pytest.raises(Exception, match="shutting down"):
        await pending
    await holder
