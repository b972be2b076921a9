"""Unit tests of a call's fixed engine-call groups (`transcription/call_batches.py`, issue 58
§4): which jobs share a call depends on the call alone, never on the order in which its
channels' segments arrive; silent segments and a channel's end fill their slots; a group
whose callers all left is cancelled. The integration test is in test_multichannel.py."""

from __future__ import annotations

import asyncio
import itertools
import random

import numpy as np

from qwen3_asr_server.engines.base import TranscribeRequest, TranscribeResult
from qwen3_asr_server.transcription.call_batches import CallBatches


def request(channel: int, index: int) -> TranscribeRequest:
    """A request whose audio length names its slot."""
    return TranscribeRequest(audio=np.zeros(100 * channel + index + 1, np.float32))


def slot(r: TranscribeRequest) -> tuple[int, int]:
    return divmod(len(r.audio) - 1, 100)


class Engine:
    """Records each group's slots; answers each request with its slot."""

    def __init__(self) -> None:
        self.groups: list[list[tuple[int, int]]] = []

    async def run(self, requests: list[TranscribeRequest]) -> list[TranscribeResult]:
        self.groups.append([slot(r) for r in requests])
        await asyncio.sleep(0)
        return [TranscribeResult(text=str(slot(r)), language="en") for r in requests]


async def call(
    batches: CallBatches, order: list[int], counts: list[int], silent: set[tuple[int, int]]
) -> dict[tuple[int, int], str]:
    """Each channel cuts its segments (`counts`) in turns taken in `order`, a few in flight."""
    texts: dict[tuple[int, int], str] = {}
    cut = [0] * len(counts)
    tasks: list[asyncio.Task[None]] = []

    async def job(channel: int, index: int) -> None:
        texts[channel, index] = (await batches.run(channel, index, request(channel, index))).text

    for channel in itertools.chain(order, itertools.cycle(range(len(counts)))):
        if cut == counts:
            break
        if cut[channel] < counts[channel]:
            index = cut[channel]
            if (channel, index) in silent:
                batches.skip(channel, index)
            else:
                tasks.append(asyncio.create_task(job(channel, index)))
            cut[channel] += 1
            if cut[channel] == counts[channel]:
                batches.end(channel, counts[channel])
        await asyncio.sleep(0)
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    return texts


async def test_the_groups_are_the_same_in_any_arrival_order() -> None:
    counts, silent = [6, 4], {(0, 3), (1, 0)}
    seen = []
    for seed in range(20):
        rng = random.Random(seed)
        order = [rng.randrange(2) for _ in range(30)]
        engine = Engine()
        texts = await call(CallBatches(2, 4, engine.run), order, counts, silent)
        assert texts == {
            (c, i): str((c, i))
            for c, n in enumerate(counts)
            for i in range(n)
            if (c, i) not in silent
        }
        seen.append(sorted(engine.groups))
    # the first segments together, then two of each channel per call, in (channel, index)
    # order; a silent segment is never decoded, and channel 1's end closes its last group
    assert seen[0] == sorted(
        [[(0, 0)], [(0, 1), (0, 2), (1, 1), (1, 2)], [(0, 4), (1, 3)], [(0, 5)]]
    )
    assert all(groups == seen[0] for groups in seen), seen


async def test_channels_beyond_the_batch_size_go_in_bands() -> None:
    engine = Engine()
    await call(CallBatches(3, 2, engine.run), [2, 1, 0], [2, 2, 2], set())
    assert sorted(engine.groups) == sorted([[(0, 0), (1, 0)], [(0, 1), (1, 1)], [(2, 0)], [(2, 1)]])


async def test_a_group_waits_for_every_segment_of_its_channels() -> None:
    engine = Engine()
    batches = CallBatches(2, 4, engine.run)
    first = asyncio.create_task(batches.run(0, 0, request(0, 0)))
    for _ in range(5):
        await asyncio.sleep(0)
    assert engine.groups == []  # channel 1's first segment is not cut yet
    second = asyncio.create_task(batches.run(1, 0, request(1, 0)))
    await asyncio.wait_for(asyncio.gather(first, second), 10)
    assert engine.groups == [[(0, 0), (1, 0)]]


async def test_a_group_whose_callers_all_left_is_cancelled() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def run(requests: list[TranscribeRequest]) -> list[TranscribeResult]:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise AssertionError("not cancelled")

    batches = CallBatches(2, 4, run)
    members = [asyncio.create_task(batches.run(c, 0, request(c, 0))) for c in (0, 1)]
    await asyncio.wait_for(started.wait(), 10)
    members[0].cancel()
    await asyncio.sleep(0.01)
    assert not cancelled.is_set()  # channel 1 still waits for its answer
    members[1].cancel()
    await asyncio.wait_for(cancelled.wait(), 10)
    await asyncio.gather(*members, return_exceptions=True)


async def test_a_failed_group_fails_each_of_its_callers() -> None:
    async def run(requests: list[TranscribeRequest]) -> list[TranscribeResult]:
        raise RuntimeError("engine failure")

    batches = CallBatches(2, 4, run)
    members = [batches.run(c, 0, request(c, 0)) for c in (0, 1)]
    results = await asyncio.gather(*members, return_exceptions=True)
    assert [str(r) for r in results] == ["engine failure"] * 2
