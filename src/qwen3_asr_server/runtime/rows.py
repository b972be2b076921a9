"""The scheduler's jobs as the rows of an engine that decodes step by step (the engine's
RowSource): the first job, then waiting jobs of the same kind as rows free up, each
answered the moment its row ends. A job's item is its request, or a function that builds
it when the job joins (a streaming partial then decodes the newest audio).

Finals first: while streams are live, partials and uploads leave `reserve(slots)` slots
free for finals, and a final that finds no slot free makes one running partial leave at
the next step (the youngest: it loses the least); that partial's job waits again and is
retried with the newest audio. Uploads are never made to leave."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from typing import Any

from .jobs import PARTIAL, Job

# (jobs that join, finals of the loop's key left waiting for a slot)
Taken = tuple[list[Job[Any]], int]
# (key, slots free, slots in all, slots given to the loop's first job) -> Taken
Take = Callable[[Hashable, int, int, int], Taken]
# (job, result, error, again: it left for a final and waits again)
Done = Callable[[Job[Any], Any, Exception | None, bool], None]


def reserve(slots: int) -> int:
    """Slots that only finals may take while streams are live: one in eight, at least one
    (none for a single slot: it would never decode anything else)."""
    return max(1, slots // 8) if slots >= 2 else 0


class JobRows:
    def __init__(
        self,
        first: Job[Any],
        take: Take,
        done: Done,
        started: Callable[[Job[Any]], None],
        stepped: Callable[[int, int], None] | None,
    ) -> None:
        assert first.batch is not None
        self._key = first.batch.key
        self._first: list[Job[Any]] = [first]  # already taken out of the queue
        self._take = take
        self._done = done
        self._started = started
        self._stepped = stepped
        self._slots = 0  # the loop's first take has every slot free: the decoder's size
        self._jobs: dict[int, Job[Any]] = {}  # handle -> job, for the rows in flight
        self._displaced: set[int] = set()  # rows leaving for a final (their jobs wait again)
        self._handles = itertools.count()

    def take(self, free: int) -> list[tuple[object, Any]]:
        """Called between steps, also with no slot free (a waiting final may then make a
        partial leave)."""
        self._slots = max(self._slots, free)
        jobs, self._first = self._first[:free], self._first[free:]
        joined, finals = self._take(self._key, free, self._slots, len(jobs))
        jobs += joined
        self._displace(finals)
        rows: list[tuple[object, Any]] = []
        for job in jobs:
            assert job.batch is not None
            handle = next(self._handles)
            self._jobs[handle] = job
            self._started(job)
            item = job.batch.item
            try:
                # (a copy: the loop runs inside the first job's context, entered already)
                request = job.context.copy().run(item) if callable(item) else item
                rows.append((handle, request))
            except Exception as exc:  # building the request failed: only this job fails
                self.done(handle, None, exc)
        return rows

    def _displace(self, finals: int) -> None:
        """One running partial per final that waits for a slot leaves at the next step,
        counting the rows already leaving (displaced, or their caller gone)."""
        leaving = sum(
            1 for h, job in self._jobs.items() if h in self._displaced or job.state == "cancelled"
        )
        if finals <= leaving:
            return
        partials = [
            h
            for h, job in self._jobs.items()
            if job.priority == PARTIAL and job.state != "cancelled" and h not in self._displaced
        ]
        self._displaced.update(sorted(partials, reverse=True)[: finals - leaving])

    def gone(self, handle: object) -> bool:
        job = self._jobs.get(handle)  # type: ignore[call-overload]
        return job is None or job.state == "cancelled" or handle in self._displaced

    def done(self, handle: object, result: Any, error: Exception | None) -> None:
        job = self._jobs.pop(handle, None)  # type: ignore[call-overload]
        if job is None:
            return
        # a displaced row waits again, unless its answer came first
        again = handle in self._displaced and result is None
        self._displaced.discard(handle)
        self._done(job, result, error, again)

    def stepped(self, rows: int) -> None:
        if self._stepped is not None and self._jobs:
            self._stepped(min(job.priority for job in self._jobs.values()), rows)

    def fail(self, error: Exception) -> None:
        """Every job taken and not answered yet gets `error` (the loop itself failed)."""
        self._displaced.clear()
        for handle in list(self._jobs):
            self.done(handle, None, error)
        for job in self._first:  # (never taken: the engine failed before asking)
            self._done(job, None, error, False)
        self._first = []
