"""The scheduler's queue: waiting jobs in the order they run (priority, then arrival),
with the two exceptions to that order: an upload that has waited `batch_max_wait` goes
before partials, and jobs that may share an engine call with the one taken go with it.
Not thread-safe: the scheduler holds its lock around every call."""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from typing import Any

from .jobs import BATCH, PARTIAL, REALTIME, Job


class JobQueue:
    def __init__(self, batch_max_wait: float) -> None:
        self.batch_max_wait = batch_max_wait
        self._heap: list[Job[Any]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, job: Job[Any]) -> None:
        heapq.heappush(self._heap, job)

    def requeue(self, job: Job[Any]) -> None:
        """A job that started waits again, in its old place (a partial's row that left its
        step loop for a final)."""
        job.state = "pending"
        job.displaced += 1
        self.push(job)

    def drain(self) -> list[Job[Any]]:
        jobs, self._heap = self._heap, []
        return jobs

    def ahead(self, priority: int) -> int:
        """Waiting jobs of this priority or a more urgent one."""
        return sum(1 for job in self._heap if job.priority <= priority)

    def pop(self, now: float) -> Job[Any]:
        """The next job, taken out of the queue."""
        job = self.peek(now)
        self.remove(job)
        return job

    def peek(self, now: float) -> Job[Any]:
        """The next job: the heap's first, except that a batch job waiting longer than
        `batch_max_wait` goes before partials."""
        first = self._heap[0]
        if first.priority == PARTIAL:
            waiting = [j for j in self._heap if j.priority == BATCH and j.state == "pending"]
            oldest = min(waiting, default=None)
            if oldest is not None and now - oldest.queued_at >= self.batch_max_wait:
                return oldest
        return first

    def remove(self, job: Job[Any]) -> bool:
        """Take `job` out (False: it was not waiting)."""
        if self._heap and self._heap[0] is job:
            heapq.heappop(self._heap)
            return True
        try:
            self._heap.remove(job)
        except ValueError:
            return False
        heapq.heapify(self._heap)
        return True

    def partners(self, first: Job[Any], limit: int) -> list[Job[Any]]:
        """Up to `limit` waiting jobs that may share an engine call with `first` (same key
        and priority), taken out of the queue."""
        if first.batch is None or limit < 1:
            return []
        same = [
            j
            for j in sorted(self._heap)
            if j.batch is not None
            and j.state == "pending"
            and j.priority == first.priority
            and j.batch.key == first.batch.key
        ][:limit]
        if same:
            chosen = {id(j) for j in same}
            self._heap = [j for j in self._heap if id(j) not in chosen]
            heapq.heapify(self._heap)
        return same

    def joiners(self, key: Hashable, limit: int, now: float, reserve: int = 0) -> list[Job[Any]]:
        """Up to `limit` waiting jobs that may join a running step loop of `key`, in the
        order `pop` gives, taken out of the queue; none once the next job in line cannot
        join (it runs when the loop ends, so jobs that keep joining never starve it).
        `reserve`: the last slots of `limit` go to finals only (a partial or an upload next
        in line then waits, and so does everything behind it: finals come first anyway)."""
        taken: list[Job[Any]] = []
        while len(taken) < limit and self._heap:
            job = self.peek(now)
            if job.state == "pending":
                if not joins(job, key):
                    break
                if job.priority != REALTIME and limit - len(taken) <= reserve:
                    break
            self.remove(job)
            if job.state == "pending":
                taken.append(job)
        return taken

    def finals(self, key: Hashable) -> int:
        """Finals first in line that could join a running step loop of `key` (those that
        wait for a slot when none is free)."""
        if not self._heap or self._heap[0].priority != REALTIME:
            return 0
        count = 0
        for job in sorted(j for j in self._heap if j.state == "pending"):
            if job.priority != REALTIME or not joins(job, key):
                break
            count += 1
        return count


def joins(job: Job[Any], key: Hashable) -> bool:
    """`job` is a row of a step loop of `key`."""
    return job.batch is not None and job.batch.steps is not None and job.batch.key == key
