"""A session's finals: committed utterances transcribed and emitted in order, on one task per
session. Never dropped: a failure is emitted as FinalFailed with the reason. The audio that
waits for its final is counted, and `room` is cleared while it is over the session's bound
(the session's `feed()` waits on it: back-pressure).

Bounded once no one waits: a client that has left has its queued finals joined into as few
as the utterance limit allows (`merge`: ~85 flushes of 100 ms took minutes one by one), and
a shutdown whose time is up stops them (`abandon`), saying what was not transcribed."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

import numpy as np
from loguru import logger

from ..audio.pcm import SAMPLE_RATE
from ..errors import InferenceError, ServiceError
from .config import Heard
from .events import Emit, Final, FinalFailed
from .speakers import Prints, SpeakerLabels
from .utterance import Utterance
from .voices import Part


@dataclass
class PendingFinal:
    """A committed utterance waiting for its final."""

    utt: Utterance
    audio: np.ndarray  # what is transcribed: the client's audio plus any padding
    reason: str
    early: asyncio.Task[Heard] | None  # its transcription, started before the commit
    committed: float  # time.monotonic() of the commit
    seconds: float  # the client's audio in it, without padding (Realtime usage)
    answers: list[str] = field(default_factory=list)  # flushes this final answers
    start: int = 0  # where its audio starts in the stream (samples at 16 kHz)
    prints: asyncio.Task[Prints] | None = None  # its voice fingerprints (live speakers)

    @property
    def samples(self) -> int:
        """The client's audio in it (samples), without padding."""
        return min(len(self.audio), round(self.seconds * SAMPLE_RATE))

    def times(self, first: int = 0, last: int | None = None) -> tuple[float, float]:
        """Seconds since the stream began of its samples [first, last) (within the
        client's audio)."""
        last = self.samples if last is None else min(last, self.samples)
        first = min(first, last)
        return (self.start + first) / SAMPLE_RATE, (self.start + last) / SAMPLE_RATE


class Finals:
    def __init__(
        self,
        text: Callable[[np.ndarray], Awaitable[Heard]],
        emit: Emit,
        bound: Callable[[], float],
        observe: Callable[[float], None] | None = None,
    ) -> None:
        self._text = text  # audio -> what was heard
        self._emit = emit
        self._bound = bound  # samples that may wait for their finals (the session's config)
        self._observe = observe  # end of speech -> final sent (metrics)
        self._items: deque[PendingFinal] = deque()  # queued, in order, not started
        self._running: PendingFinal | None = None
        self._wake = asyncio.Event()  # an item was queued, or close() came
        self._closing = False
        self.last: PendingFinal | None = None  # queued or running, not yet emitted
        self.pending = 0  # samples committed whose final has not been emitted yet
        self.room = asyncio.Event()
        self.room.set()
        self._bounded = True  # False once the client has left: no one to hold back
        self.labels: SpeakerLabels | None = None  # live speakers, when the session asks
        self._task = asyncio.create_task(self._run())

    async def put(self, item: PendingFinal) -> None:
        if self.labels is not None and item.prints is None and item.samples:
            item.prints = self.labels.fingerprint(item.audio[: item.samples])
        self.pending += len(item.audio)
        if self._bounded and self.pending > self._bound():
            self.room.clear()
        self.last = item
        self._items.append(item)
        self._wake.set()

    def answer_pending(self, action: str) -> bool:
        """A flush found nothing buffered: the final still pending (voice detection closed
        its utterance) answers it, sent even when its text is empty (its event carries
        `answers`). False when no final is pending: nothing at all was buffered."""
        if self.last is None:
            return False
        self.last.answers.append(action)
        return True

    def unbound(self) -> None:
        """The client has left: nothing more will come to hold back, so `room` stays set (a
        feed waiting for it goes on: the audio it was given is still transcribed)."""
        self._bounded = False
        self.room.set()

    def merge(self, limit: int, reason: str) -> None:
        """The client has left (`reason`): the queued finals become as few as possible, in
        order, each at most `limit` samples (the utterance limit: what one final may hold);
        a final whose transcription already started stays as it is. Its text is logged."""
        groups: list[list[PendingFinal]] = []
        size = 0  # samples in the last group
        for item in self._items:
            last = groups[-1] if groups else None
            if (
                last is None
                or last[0].early is not None
                or item.early is not None
                or size + len(item.audio) > limit
            ):
                groups.append([item])
                size = len(item.audio)
                continue
            last.append(item)
            size += len(item.audio)
        # each group's audio copied once (joining item by item copied it once per item)
        merged = deque(self._join(group, reason) for group in groups)
        if len(merged) < len(self._items):
            logger.info("client gone: {} finals joined into {}", len(self._items), len(merged))
        self._items = merged
        if merged:
            self.last = merged[-1]

    @staticmethod
    def _join(group: list[PendingFinal], reason: str) -> PendingFinal:
        first = group[0]
        if len(group) == 1:
            return first
        audio = np.concatenate([item.audio for item in group])
        answers = [answer for item in group for answer in item.answers]
        seconds = sum(item.seconds for item in group)
        for item in group:  # no one reads their speakers: the joined final has none
            if item.prints is not None:
                item.prints.cancel()
        return PendingFinal(
            first.utt, audio, reason, None, first.committed, seconds, answers, first.start
        )

    def abandon(self) -> tuple[int, float]:
        """Stop now (a shutdown's time is up): the finals not emitted, and the seconds of the
        client's audio in them."""
        items = [*([self._running] if self._running is not None else []), *self._items]
        self._items.clear()
        for item in items:
            for task in (item.early, item.prints):
                if task is not None:
                    task.cancel()
        self._task.cancel()
        self.room.set()
        return len(items), sum(item.seconds for item in items)

    async def close(self) -> None:
        """Wait until every final queued so far has been emitted (or `abandon`ed)."""
        self._closing = True
        self._wake.set()
        await asyncio.wait([self._task])

    async def _run(self) -> None:
        while True:
            while not self._items:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
            item = self._running = self._items.popleft()
            try:
                await self._final(item)
                if item.reason == "silence" and self._observe is not None:
                    self._observe(time.monotonic() - item.committed)
            finally:
                self._running = None
                if self.last is item:
                    self.last = None
                self.pending -= len(item.audio)
                if self.pending <= self._bound():
                    self.room.set()

    async def _final(self, item: PendingFinal) -> None:
        utt = item.utt
        try:
            if item.early is not None:
                heard = await item.early
            else:
                heard = await self._text(item.audio)
        except Exception as exc:
            # Finals are never refused for queue depth; this is a failure (no backend, a
            # timeout, the model cannot load): the client hears why and whether to retry.
            logger.opt(exception=exc).error("final transcription failed")
            error = exc if isinstance(exc, ServiceError) else InferenceError(str(exc))
            if self.last is item:
                self.last = None
            await self._emit(
                FinalFailed(
                    utterance=utt.id,
                    reason=item.reason,
                    answers=tuple(item.answers),
                    duration=item.seconds,
                    error=error,
                    start=item.times()[0],
                    end=item.times()[1],
                )
            )
            return
        seconds = len(item.audio) / SAMPLE_RATE
        logger.debug("final ({}, {:.2f} s): {}", item.reason, seconds, heard.text)
        start, end = item.times()
        final = Final(utt.id, heard.text, item.reason, (), item.seconds, heard.language)
        final = replace(final, logprobs=heard.logprobs, usage=heard.usage, start=start, end=end)
        labels = self.labels
        events = [replace(final, diarized=labels is not None)]
        if labels is not None and item.prints is not None:
            events = await self._speakers(labels, item, final)
        # Only now is it answered: a flush or reset that came while its speakers were found
        # waited for it (it is still `last`), and is answered by its last event.
        if self.last is item:
            self.last = None  # a flush from now on is answered by its own final
        events = [replace(event, more=True) for event in events[:-1]] + events[-1:]
        events[-1] = replace(events[-1], answers=tuple(item.answers))
        for event in events:
            await self._emit(event)

    async def _speakers(
        self, labels: SpeakerLabels, item: PendingFinal, final: Final
    ) -> list[Final]:
        """The final labelled with its speaker (None: not known in time), or one final per
        speaker where the speaker changes inside it (`split`)."""
        parts = await labels.parts(item.prints, item.samples) if item.prints else None
        if not parts or len(parts) == 1 or not labels.split:
            return [replace(final, diarized=True, speaker=main_speaker(parts))]
        parts = await labels.place(parts, item.audio, item.samples)
        return await self._split(item, final, parts)

    async def _split(self, item: PendingFinal, final: Final, parts: list[Part]) -> list[Final]:
        """A final whose speaker changes: one final per speaker's part, each transcribed on
        its own (its audio, times and speaker); only the last answers flushes. If a part's
        transcription fails, the whole final goes out as one, with its main speaker."""
        try:
            heard = await asyncio.gather(*(self._text(item.audio[p.start : p.end]) for p in parts))
        except Exception as exc:
            logger.opt(exception=exc).warning("a speaker's part of a final failed")
            return [replace(final, diarized=True, speaker=main_speaker(parts))]
        events = []
        for part, said in zip(parts, heard, strict=True):
            start, end = item.times(part.start, part.end)
            seconds = (min(part.end, item.samples) - min(part.start, item.samples)) / SAMPLE_RATE
            events.append(
                replace(
                    final,
                    text=said.text,
                    duration=seconds,
                    language=said.language or final.language,
                    logprobs=said.logprobs,
                    usage=said.usage,
                    start=start,
                    end=end,
                    speaker=part.speaker,
                    diarized=True,
                )
            )
        return events


def main_speaker(parts: list[Part] | None) -> str | None:
    """Who speaks most of a final (None: nobody could be said)."""
    if not parts:
        return None
    return max(parts, key=lambda p: p.end - p.start).speaker
