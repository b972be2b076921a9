"""The streamed merge of a multichannel upload (issue 44): segments leave in time order as
soon as no channel can still produce an earlier one, not once every channel is done. The
channels here are stand-in part streams that wait on events (a unit test of the merge; the
real stream is tests/test_multichannel.py's)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from qwen3_asr_server.audio.segmentation import Span
from qwen3_asr_server.transcript import Segment
from qwen3_asr_server.transcription.channels import in_time_order
from qwen3_asr_server.transcription.long_form import SegmentResult

RATE = 16000


def part(index: int, start_s: float, end_s: float, *starts: float) -> SegmentResult:
    segments = [Segment(s, min(s + 1.0, end_s), f"at {s:g}") for s in starts]
    span = Span(int(start_s * RATE), int(end_s * RATE))
    return SegmentResult(index, span, "", None, segments, 0.0, 0.0)


async def channel(
    parts: list[SegmentResult], gates: list[asyncio.Event]
) -> AsyncIterator[SegmentResult]:
    for p, gate in zip(parts, gates, strict=True):
        await gate.wait()
        yield p


async def test_a_segment_leaves_once_no_channel_can_precede_it() -> None:
    a = [part(0, 0, 10, 1.0, 6.0), part(1, 10, 20, 12.0)]
    b = [part(0, 0, 8, 3.0), part(1, 8, 30, 9.0, 25.0)]
    gates = {name: [asyncio.Event(), asyncio.Event()] for name in "ab"}
    kept: list[tuple[int, int]] = []
    merged = in_time_order(
        [channel(a, gates["a"]), channel(b, gates["b"])],
        lambda c, p: kept.append((c, p.index)),
    )
    out: list[str] = []

    async def read() -> None:
        async for segment in merged:
            out.append(segment.text)

    reader = asyncio.create_task(read())

    async def settle() -> None:
        for _ in range(20):  # let the merge take what is ready (no timers)
            await asyncio.sleep(0)

    gates["a"][0].set()
    await settle()
    assert out == []  # channel b may still start before 1.0
    gates["b"][0].set()
    await settle()
    assert out == ["at 1", "at 3", "at 6"]  # before b's second part and a's second: 6 < 8
    gates["b"][1].set()
    await settle()
    assert out == ["at 1", "at 3", "at 6", "at 9"]  # 12 and 25 wait for a (next ≥ 10)
    gates["a"][1].set()
    await asyncio.wait_for(reader, 5)
    assert out == ["at 1", "at 3", "at 6", "at 9", "at 12", "at 25"]
    assert sorted(kept) == [(0, 0), (0, 1), (1, 0), (1, 1)]


async def test_a_segment_at_a_channels_frontier_waits_for_that_channel() -> None:
    """A tie: channel 1 has a segment at 2.0 s, and channel 0's part so far ends at 2.0 s,
    so channel 0 may still start one at 2.0 s. Channel 1's waits, and channel 0's goes
    first (channel order on a tie), whatever order the parts arrive in."""
    a = [part(0, 0, 2, 0.5), part(1, 2, 10, 2.0)]
    b = [part(0, 0, 5, 2.0)]
    for segment in b[0].segments:
        segment.text = "b " + segment.text
    gates = {"a": [asyncio.Event(), asyncio.Event()], "b": [asyncio.Event()]}
    merged = in_time_order([channel(a, gates["a"]), channel(b, gates["b"])], lambda c, p: None)
    out: list[str] = []

    async def read() -> None:
        async for segment in merged:
            out.append(segment.text)

    reader = asyncio.create_task(read())
    gates["a"][0].set()
    gates["b"][0].set()
    for _ in range(20):  # let the merge take what is ready (no timers)
        await asyncio.sleep(0)
    assert out == ["at 0.5"]  # b's 2.0 waits: a's next part starts at 2.0
    gates["a"][1].set()
    await asyncio.wait_for(reader, 5)
    assert out == ["at 0.5", "at 2", "b at 2"]


async def test_a_failing_channel_fails_the_merge_and_stops_the_other() -> None:
    stopped = asyncio.Event()

    async def fails() -> AsyncIterator[SegmentResult]:
        yield part(0, 0, 5, 1.0)
        raise RuntimeError("engine failed")

    async def endless() -> AsyncIterator[SegmentResult]:
        try:
            yield part(0, 0, 2, 0.5)
            await asyncio.Event().wait()
            yield part(1, 2, 4)  # never
        finally:
            stopped.set()

    with pytest.raises(RuntimeError, match="engine failed"):
        async for _ in in_time_order([fails(), endless()], lambda c, p: None):
            pass
    assert stopped.is_set()


def test_a_channel_is_cut_into_turns_at_pauses_of_0_6_s() -> None:
    from qwen3_asr_server.audio.segmentation import speech_turns
    from qwen3_asr_server.audio.vad import FRAME

    probs = np.zeros(100, np.float32)
    probs[0:11] = probs[16:31] = 0.9  # a 5-frame (0.16 s) gap: one turn
    probs[71:81] = 0.9  # after 40 frames (1.28 s): another
    turns = speech_turns(probs, total=100 * FRAME)
    pad = int(0.2 * RATE)
    assert turns == [Span(0, 31 * FRAME + pad), Span(71 * FRAME - pad, 81 * FRAME + pad)]
    assert speech_turns(np.zeros(10, np.float32), 10 * FRAME) == []


def test_turns_are_joined_across_pauses_where_no_other_channel_speaks() -> None:
    from qwen3_asr_server.audio.segmentation import joined_turns

    def s(a: float, b: float) -> Span:
        return Span(int(a * RATE), int(b * RATE))

    mine = [s(0, 1), s(3, 4), s(6, 7)]
    assert joined_turns(mine, [s(4.5, 5.5)]) == [s(0, 4), s(6, 7)]  # the other spoke at 4.5
    assert joined_turns(mine, [s(0.5, 2.5)]) == [s(0, 1), s(3, 7)]  # a cut-in counts too
    assert joined_turns(mine, []) == [s(0, 7)]
