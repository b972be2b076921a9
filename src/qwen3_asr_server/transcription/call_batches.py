"""A call's jobs in engine calls of a fixed composition (issue 58 §4).

Whisper's batched word times move by tens of milliseconds with what shares the batch, and
the tails it decodes again start there: a call's text changed with the server's load when
its jobs were batched by timing (issue 49). Decoding each job alone made the text stable
and cost about a third more. Here the call itself decides which of its jobs share an
engine call: its channels in bands of at most MAX_BATCH_SIZE, each channel's first segment
in one group (the first events come early), then `depth` segments of each channel of the
band per group, in (channel, index) order. A group is one scheduler job (no other upload's
job or live job can join it), submitted once all its segments are cut, or are known to be
silent (never decoded) or past their channel's end. So the same file gets the same engine
calls, and the same text, whatever else is queued.

A group waits only for segments its channels cut before awaiting the group: each channel
keeps at least `depth` + 1 segments in flight (the service's window), so the lowest group
not yet submitted is always complete once every channel has cut up to it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ..engines.base import TranscribeRequest, TranscribeResult

Run = Callable[[list[TranscribeRequest]], Awaitable[list[TranscribeResult]]]
Slot = tuple[int, int]  # (channel, segment index)
Member = tuple[TranscribeRequest, "asyncio.Future[TranscribeResult]"]


@dataclass
class Group:
    members: dict[Slot, Member | None] = field(default_factory=dict)  # None: silent
    task: asyncio.Task[None] | None = None


class CallBatches:
    """The fixed groups of one call; `run` submits one group's requests as one job."""

    def __init__(self, channels: int, size: int, run: Run) -> None:
        self.channels = channels
        self.width = max(1, min(channels, size))  # channels per band
        self.depth = max(1, size // self.width)  # each channel's segments per later group
        self._run = run
        self._ends: list[int | None] = [None] * channels
        self._groups: dict[Slot, Group] = {}

    def seat(self, channel: int) -> Seat:
        return Seat(self, channel)

    def key(self, channel: int, index: int) -> Slot:
        """(band, row): the group of a channel's `index`-th segment."""
        row = 0 if index == 0 else 1 + (index - 1) // self.depth
        return channel // self.width, row

    def slots(self, key: Slot) -> list[Slot]:
        band, row = key
        first = 0 if row == 0 else 1 + (row - 1) * self.depth
        last = 1 if row == 0 else first + self.depth
        channels = range(band * self.width, min(self.channels, (band + 1) * self.width))
        return [(c, i) for c in channels for i in range(first, last)]

    async def run(self, channel: int, index: int, request: TranscribeRequest) -> TranscribeResult:
        future: asyncio.Future[TranscribeResult] = asyncio.get_running_loop().create_future()
        key = self.key(channel, index)
        group = self._groups.setdefault(key, Group())
        group.members[channel, index] = (request, future)
        self._check(key)
        try:
            return await future
        finally:  # every caller of a submitted group has gone: its job is cancelled
            task = group.task
            if task is not None and all(m is None or m[1].done() for m in group.members.values()):
                task.cancel()

    def skip(self, channel: int, index: int) -> None:
        """A silent segment: its slot is filled, nothing is decoded."""
        key = self.key(channel, index)
        self._groups.setdefault(key, Group()).members[channel, index] = None
        self._check(key)

    def end(self, channel: int, count: int) -> None:
        """The channel has no segment from `count` on (the first call counts)."""
        if self._ends[channel] is None:
            self._ends[channel] = count
            for key in list(self._groups):
                self._check(key)

    def _check(self, key: Slot) -> None:
        group = self._groups.get(key)
        if group is None or group.task is not None:
            return
        for channel, index in self.slots(key):
            end = self._ends[channel]
            if (channel, index) not in group.members and (end is None or index < end):
                return  # still to be cut
        members = [m for _, m in sorted(group.members.items()) if m is not None]
        if all(future.done() for _, future in members):  # all silent, or all gone
            del self._groups[key]
            return
        group.task = asyncio.create_task(self._submit(key, members))

    async def _submit(self, key: Slot, members: list[Member]) -> None:
        try:
            results = await self._run([request for request, _ in members])
        except BaseException as exc:
            for _, future in members:
                if not future.done():
                    future.set_exception(exc) if isinstance(exc, Exception) else future.cancel()
            if not isinstance(exc, Exception):
                raise
        else:
            for (_, future), result in zip(members, results, strict=True):
                if not future.done():
                    future.set_result(result)
        finally:
            del self._groups[key]


@dataclass(frozen=True)
class Seat:
    """One channel's view of its call's groups (`Transcriber.stream`'s `seat`)."""

    batches: CallBatches
    channel: int

    async def run(self, index: int, request: TranscribeRequest) -> TranscribeResult:
        return await self.batches.run(self.channel, index, request)

    def skip(self, index: int) -> None:
        self.batches.skip(self.channel, index)

    def end(self, count: int) -> None:
        self.batches.end(self.channel, count)
