"""The decode loop of the Qwen engine's step path: rows from a RowSource join between steps
(the rows taken together are prefilled together), leave at their end token or budget, or
when nobody waits for them any more, and each is answered the moment it ends, not when the
whole batch does."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

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
# prefills the rows taken together; each is a Row, or answered another way, or its error
Join = Callable[[Joining], "Sequence[Row | TranscribeResult | Exception]"]


def run_rows(
    decoder: Decoder, source: RowSource, join: Join, finish: Callable[[Row], TranscribeResult]
) -> None:
    """Until the source has no row left. `join` prefills the rows taken together (or
    answers one another way: a result, or its error); `finish` turns an ended row into its
    answer. If the source itself fails, the rows in flight are dropped (the cache is left
    empty for the next call)."""
    try:
        loop(decoder, source, join, finish)
    except BaseException:
        decoder.leave(lambda r: True)
        raise


def loop(
    decoder: Decoder, source: RowSource, join: Join, finish: Callable[[Row], TranscribeResult]
) -> None:
    while True:
        answer(decoder, source, finish)  # rows that ended in the last step, or were left
        # asked with no slot free too: a final that waits may then make a partial leave
        taken = source.take(decoder.free)
        took = bool(taken)
        if taken:
            joining: Joining = [(h, r, functools.partial(source.gone, h)) for h, r in taken]
            try:
                joined = join(joining)
            except Exception as exc:  # the prefill itself failed: the rows taken hear why
                failed = {id(h) for h, _ in taken}
                decoder.leave(lambda r, failed=failed: id(r.handle) in failed)  # type: ignore[misc]
                joined = [exc] * len(taken)
            for (handle, _), outcome in zip(taken, joined, strict=True):
                if isinstance(outcome, Exception):
                    source.done(handle, None, outcome)
                elif isinstance(outcome, TranscribeResult):
                    source.done(handle, outcome, None)
        answer(decoder, source, finish)  # rows that ended at their first token
        if not decoder.rows:
            if took:
                continue
            return
        source.stepped(len(decoder.rows))
        try:
            decoder.step()
        except Exception as exc:  # the step itself failed: every row in it hears why
            for row in decoder.leave(lambda r: True):
                source.done(row.handle, None, exc)


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
