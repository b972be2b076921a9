"""What the scheduler queues: jobs, batch specs, admissions and the delivery of results to
the event loop (scheduler.py is the queue and its threads)."""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from loguru import logger

T = TypeVar("T")

REALTIME = 0  # streaming finals
PARTIAL = 1  # streaming partials
BATCH = 2  # uploads


@dataclass(order=True)
class Job(Generic[T]):
    priority: int
    seq: int
    fn: Callable[[], T] = field(compare=False)
    future: asyncio.Future[T] = field(compare=False)
    loop: asyncio.AbstractEventLoop = field(compare=False)
    # The caller's context (request id for the logs) travels with the job to the thread.
    context: contextvars.Context = field(default_factory=contextvars.copy_context, compare=False)
    batch: BatchSpec | None = field(default=None, compare=False)
    queued_at: float = field(default_factory=time.monotonic, compare=False)
    state: str = field(default="pending", compare=False)  # pending|running|done|cancelled
    # times its row left a step loop for a final and it waited again (a streaming partial)
    displaced: int = field(default=0, compare=False)


@dataclass(frozen=True)
class BatchSpec:
    """Lets the worker run this job together with other waiting jobs of the same `key` and
    priority: `run_many(items)` returns one result per item, in order. With `steps` (an
    engine that decodes step by step: `decode_rows`), the job is a row instead, and waiting
    jobs of the same key join the running rows between steps, whatever their priority."""

    key: Hashable
    item: Any  # the request, or a function that builds it when the job starts
    run_many: Callable[[list[Any]], list[Any]]
    steps: Callable[[Any], None] | None = None


class Admission:
    """Admitted work counted by admission until its first job is queued (`arrived()`) or it
    ends (`release()`); either, any number of times, counts once."""

    def __init__(self, on_arrival: Callable[[], None]) -> None:
        self._on_arrival: Callable[[], None] | None = on_arrival

    def arrived(self) -> None:
        on_arrival, self._on_arrival = self._on_arrival, None
        if on_arrival is not None:
            on_arrival()

    release = arrived


# The admission of the work the current task is doing (set by `admit()`).
ADMISSION: contextvars.ContextVar[Admission | None] = contextvars.ContextVar(
    "admission", default=None
)


def send(job: Job[Any], result: Any, error: BaseException | None) -> None:
    """From the worker thread: the job's answer, to its caller's event loop."""
    try:
        job.loop.call_soon_threadsafe(deliver, job.future, result, error)
    except RuntimeError:  # the caller's event loop is closed
        logger.debug("event loop closed before the result could be delivered")


def deliver(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """Runs on the event loop. The caller may have gone: then there is nobody to tell."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
