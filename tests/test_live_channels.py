"""A stereo live stream's pieces (issue 44's review fixes, tested by issue 49): the echo
gate's delayed reference follows a flush, and ChannelGroup's feed, release and close take
turns, with close safe to call twice at once. Unit tests: the gate is the real one; the
channels' sessions are recorders (the end-to-end stream is tests/test_ws_stereo.py's)."""

from __future__ import annotations

import asyncio
import inspect
import threading
from typing import Any, Literal

import numpy as np

from qwen3_asr_server.audio.channels import GATE_FRAME, MAX_LAG, EchoGate
from qwen3_asr_server.streaming.channels import ChannelGroup

RATE = 16000


def noise(samples: int, channels: int = 2, seed: int = 0) -> np.ndarray:
    """Independent noise per channel, as loud on each: no frame is an echo."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((samples, channels)) * 0.1).astype(np.float32)


def test_the_echo_gate_silences_the_echo_right_after_a_flush() -> None:
    """Channel 1 carries channel 0's echo 30 ms late (the longest lag), 25 dB quieter. A
    flush passes on the incomplete frame (`rest`); those samples are part of the delayed
    reference the next frames are compared with, so the echo is cut from the first frame
    after the flush (before the fix, the reference skipped them and the first frames'
    echo went through)."""
    lag = MAX_LAG
    voice = noise(3 * RATE, channels=1)[:, 0] * 3
    tracks = np.zeros((len(voice), 2), np.float32)
    tracks[:, 0] = voice
    tracks[lag:, 1] = voice[:-lag] * 10 ** (-25 / 20)
    gate = EchoGate(2)
    cut = RATE + 100  # the flush comes 100 samples into a frame
    assert cut % GATE_FRAME == 100
    before = gate.push(tracks[:cut])
    assert not before[:, 1].any()  # the echo is cut while the stream runs
    held = gate.rest()  # the flush: the held samples go on ungated
    assert len(held) == 100
    after = gate.push(tracks[cut:])
    assert np.array_equal(after[:, 0], tracks[cut : cut + len(after), 0])
    assert not after[:, 1].any(), np.flatnonzero(after[:, 1])[:5]


class Lane:
    """A channel's session that records what it is given (and may hold a feed)."""

    def __init__(self) -> None:
        self.heard: list[np.ndarray] = []
        self.closes: list[str] = []
        self.hold: asyncio.Event | None = None  # a feed waits for it, when set
        self.holding = asyncio.Event()

    async def feed(self, samples: np.ndarray) -> None:
        if self.hold is not None:
            self.holding.set()
            await self.hold.wait()
        self.heard.append(samples.copy())

    async def close(self, reason: str) -> None:
        self.closes.append(reason)

    def audio(self) -> np.ndarray:
        return np.concatenate(self.heard) if self.heard else np.zeros(0, np.float32)


class WatchedTurn(asyncio.Lock):
    """ChannelGroup's turn; `contended` is set when a caller has to wait for it."""

    def __init__(self) -> None:
        super().__init__()
        self.contended = asyncio.Event()

    async def acquire(self) -> Literal[True]:
        if self.locked():
            self.contended.set()
        return await super().acquire()


async def suspended(task: asyncio.Task[Any]) -> None:
    """Until `task` has run to its first wait (its coroutine suspended, not merely created)."""
    coro: Any = task.get_coro()
    while inspect.getcoroutinestate(coro) == inspect.CORO_CREATED:
        await asyncio.sleep(0)


class HeldGate(EchoGate):
    """The real gate, whose `push` (run on a thread) waits for `go` once it has cut."""

    def __init__(self, channels: int) -> None:
        super().__init__(channels)
        self.pushed = threading.Event()
        self.go = threading.Event()

    def push(self, samples: np.ndarray) -> np.ndarray:
        out = super().push(samples)
        self.pushed.set()
        self.go.wait(60)
        return out


async def test_a_close_during_a_feed_waits_its_turn() -> None:
    """A shutdown's close while the receive loop's feed is in the gate: the close's release
    waits for the feed, so every channel gets each sample once, in order (without the turn,
    the held rest went out before the feed's frames)."""
    lanes = [Lane(), Lane()]
    group = ChannelGroup(lanes)
    gate = group.gate = HeldGate(2)
    turn = group._turn = WatchedTurn()
    samples = noise(3 * GATE_FRAME + 40)
    feeding = asyncio.create_task(group.feed(samples))
    assert await asyncio.to_thread(gate.pushed.wait, 60)  # the feed is in the gate's thread
    closing = asyncio.create_task(group.close("shutdown"))
    await asyncio.wait_for(turn.contended.wait(), 60)  # the close waits for its turn
    gate.go.set()
    await asyncio.wait_for(asyncio.gather(feeding, closing), 60)
    for c, lane in enumerate(lanes):
        assert np.array_equal(lane.audio(), samples[:, c]), c
        assert lane.closes == ["shutdown"]


async def test_two_closes_at_once_close_each_channel_once() -> None:
    """A disconnect's close, cancelled while it passes on the held samples (the receive
    loop is cancelled at shutdown), and the shutdown's close: the first close still
    finishes, once; the held samples arrive once; each channel is closed once."""
    lanes = [Lane(), Lane()]
    group = ChannelGroup(lanes)
    samples = noise(3 * GATE_FRAME + 40)
    await group.feed(samples)  # 3 frames given, 40 samples held
    hold = lanes[0].hold = asyncio.Event()
    first = asyncio.create_task(group.close("disconnect"))
    await asyncio.wait_for(lanes[0].holding.wait(), 60)  # passing on the held samples
    first.cancel()
    second = asyncio.create_task(group.close("shutdown"))
    await asyncio.wait_for(suspended(second), 60)  # the second close waits (for the first)
    hold.set()
    await asyncio.wait_for(second, 60)
    await asyncio.gather(first, return_exceptions=True)
    for c, lane in enumerate(lanes):
        assert np.array_equal(lane.audio(), samples[:, c]), c
        assert lane.closes == ["disconnect"], lane.closes
