"""The scheduler's jobs as the rows of an engine that decodes step by step (the engine's
RowSource): the first job, then waiting jobs of the same kind as rows free up, each
answered the moment its row ends. A job's item is its request, or a function that builds
it when the job joins (a streaming partial then decodes the newest audio)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from typing import Any

from .jobs import Job

Take = Callable[[Hashable, int], list[Job[Any]]]
Done = Callable[[Job[Any], Any, Exception | None], None]


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
        self._jobs: dict[int, Job[Any]] = {}  # handle -> job, for the rows in flight
        self._handles = itertools.count()

    def take(self, free: int) -> list[tuple[object, Any]]:
        jobs, self._first = self._first[:free], self._first[free:]
        if len(jobs) < free:
            jobs += self._take(self._key, free - len(jobs))
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

    def gone(self, handle: object) -> bool:
        job = self._jobs.get(handle)  # type: ignore[call-overload]
        return job is None or job.state == "cancelled"

    def done(self, handle: object, result: Any, error: Exception | None) -> None:
        job = self._jobs.pop(handle, None)  # type: ignore[call-overload]
        if job is not None:
            self._done(job, result, error)

    def stepped(self, rows: int) -> None:
        if self._stepped is not None and self._jobs:
            self._stepped(min(job.priority for job in self._jobs.values()), rows)

    def fail(self, error: Exception) -> None:
        """Every job taken and not answered yet gets `error` (the loop itself failed)."""
        for handle in list(self._jobs):
            self.done(handle, None, error)
        for job in self._first:  # (never taken: the engine failed before asking)
            self._done(job, None, error)
        self._first = []
