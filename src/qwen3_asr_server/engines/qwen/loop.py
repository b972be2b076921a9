"""The decode loop of the Qwen engine's step path: rows from a RowSource join between steps
(the rows taken together are prefilled together), leave at their end token or budget, or
when nobody waits for them any more, and each is answered the moment it ends, not when the
whole batch does.

Rows taken are prepared off this thread (`prepare`: prompts, tokens, log-mel), while the
rows in flight keep stepping; they join at the first step boundary after they are ready
(at once when no row is in flight). Their slots are kept for them meanwhile."""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from ..base import (
    JobCancelledError,
    RowSource,
    ShouldStop,
    TranscribeRequest,
    TranscribeResult,
)

if TYPE_CHECKING:  # (the loop itself runs on any decoder: the scheduler's tests use a fake)
    from .rows import Decoder, Row

Joining = list[tuple[object, TranscribeRequest, ShouldStop]]


class Pending(Protocol):
    """The rows of one take being prepared (one entry per row, in order)."""

    def __len__(self) -> int: ...

    def ready(self) -> bool: ...

    def rows(self) -> Sequence[object]:
        """Waits until every row is prepared."""
        ...


Prepare = Callable[[Joining], Pending]
# prefills the prepared rows taken together; each is a Row, or answered another way, or its
# error (a row whose caller went away while it was prepared comes as JobCancelledError)
Join = Callable[[Joining, Sequence[object]], "Sequence[Row | TranscribeResult | Exception]"]


class Prepared:
    """A take with nothing left to prepare."""

    def __init__(self, rows: Sequence[object]) -> None:
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def ready(self) -> bool:
        return True

    def rows(self) -> Sequence[object]:
        return self._rows


def nothing_to_prepare(joining: Joining) -> Prepared:
    return Prepared([None] * len(joining))


def run_rows(
    decoder: Decoder,
    source: RowSource,
    prepare: Prepare,
    join: Join,
    finish: Callable[[Row], TranscribeResult],
) -> None:
    """Until the source has no row left. `prepare` starts the preparation of the rows
    taken together, `join` prefills them once prepared (or answers one another way: a
    result, or its error); `finish` turns an ended row into its answer. If the source
    itself fails, the rows in flight are dropped (the cache is left empty for the next
    call); the source answers the rows still being prepared."""
    try:
        loop(decoder, source, prepare, join, finish)
    except BaseException:
        decoder.leave(lambda r: True)
        raise


def loop(
    decoder: Decoder,
    source: RowSource,
    prepare: Prepare,
    join: Join,
    finish: Callable[[Row], TranscribeResult],
) -> None:
    pending: deque[tuple[Joining, Pending]] = deque()
    while True:
        answer(decoder, source, finish)  # rows that ended in the last step, or were left
        # asked with no slot free too: a final that waits may then make a partial leave
        waiting = sum(len(p) for _, p in pending)  # slots kept for the rows being prepared
        taken = source.take(max(0, decoder.free - waiting))
        if taken:
            joining: Joining = [(h, r, functools.partial(source.gone, h)) for h, r in taken]
            pending.append((joining, prepare(joining)))
        # ready rows join; with no row in flight, the loop waits for the oldest take
        while pending and (pending[0][1].ready() or not decoder.rows):
            joining, prepared = pending.popleft()
            joined(decoder, source, join, joining, prepared.rows())
        answer(decoder, source, finish)  # rows that ended at their first token
        if not decoder.rows:
            if pending or taken:
                continue
            return
        source.stepped(len(decoder.rows))
        try:
            decoder.step()
        except Exception as exc:  # the step itself failed: every row in it hears why
            for row in decoder.leave(lambda r: True):
                source.done(row.handle, None, exc)


def joined(
    decoder: Decoder, source: RowSource, join: Join, joining: Joining, rows: Sequence[object]
) -> None:
    """Prefill the prepared rows of one take; answer those answered another way."""
    gone = JobCancelledError("its caller has gone")
    rows = [gone if source.gone(h) else row for (h, _, _), row in zip(joining, rows, strict=True)]
    try:
        outcomes = join(joining, rows)
    except Exception as exc:  # the prefill itself failed: the rows taken hear why
        failed = {id(h) for h, _, _ in joining}
        decoder.leave(lambda r: id(r.handle) in failed)
        outcomes = [exc] * len(joining)
    for (handle, _, _), outcome in zip(joining, outcomes, strict=True):
        if isinstance(outcome, Exception):
            source.done(handle, None, outcome)
        elif isinstance(outcome, TranscribeResult):
            source.done(handle, outcome, None)


def answer(decoder: Decoder, source: RowSource, finish: Callable[[Row], TranscribeResult]) -> None:
    """Answer the rows that ended, and drop those whose caller has gone."""
    for row in decoder.leave(lambda r: r.ended or source.gone(r.handle)):
        if not row.ended:
            source.done(row.handle, None, JobCancelledError("its caller has gone"))
            continue
        try:
            source.done(row.handle, finish(row), None)
        except Exception as exc:
            source.done(row.handle, None, exc)


class ListSource:
    """The rows of one `transcribe_batch` call: all taken at once, answers kept in order."""

    def __init__(self, requests: list[TranscribeRequest], should_stop: ShouldStop) -> None:
        self._waiting: list[tuple[object, TranscribeRequest]] = list(enumerate(requests))
        self._should_stop = should_stop
        self.results: list[TranscribeResult | None] = [None] * len(requests)
        self.error: Exception | None = None

    def take(self, free: int) -> list[tuple[object, TranscribeRequest]]:
        taken, self._waiting = self._waiting[:free], self._waiting[free:]
        return taken

    def gone(self, handle: object) -> bool:
        return self._should_stop()

    def done(
        self, handle: object, result: TranscribeResult | None, error: Exception | None
    ) -> None:
        assert isinstance(handle, int)
        if error is not None:
            self.error = self.error or error
        self.results[handle] = result

    def stepped(self, rows: int) -> None:
        pass

    def answers(self) -> list[TranscribeResult]:
        """The results in order; the first error if a row failed (the scheduler then runs
        the jobs one by one, so that one bad input fails only itself)."""
        if self.error is not None:
            raise self.error
        return [r for r in self.results if r is not None]
