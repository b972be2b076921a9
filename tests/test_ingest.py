"""PcmIngest: the one place both WebSocket protocols turn client PCM into session audio."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from qwen3_asr_server.streaming.ingest import PcmIngest
from streaming_client import pcm16


class Sink:
    """Stands in for a StreamSession: counts what it is fed."""

    def __init__(self) -> None:
        self.samples_in = 0
        self.fed: list[np.ndarray] = []

    async def feed(self, samples: np.ndarray) -> None:
        self.samples_in += len(samples)
        self.fed.append(samples)


def tone(rate: int, seconds: float) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


async def test_16_khz_is_fed_as_it_came() -> None:
    sink = Sink()
    ingest = PcmIngest(16000, max_seconds=10)
    audio = tone(16000, 0.5)
    assert await ingest.feed(sink, pcm16(audio))  # type: ignore[arg-type]
    assert np.allclose(np.concatenate(sink.fed), audio, atol=4 / 32768)  # s16 rounding


async def test_other_rates_are_resampled_and_a_rate_change_takes_effect() -> None:
    sink = Sink()
    ingest = PcmIngest(8000, max_seconds=10)
    for _ in range(10):  # 1 s at 8 kHz in 100 ms messages
        assert await ingest.feed(sink, pcm16(tone(8000, 0.1)))  # type: ignore[arg-type]
    assert abs(sink.samples_in - 16000) < 1600  # the streaming resampler holds back a little
    ingest.set_rate(24000)
    assert ingest.rate == 24000
    before = sink.samples_in
    for _ in range(10):
        await ingest.feed(sink, pcm16(tone(24000, 0.1)))  # type: ignore[arg-type]
    assert abs(sink.samples_in - before - 16000) < 1600
    ingest.set_rate(16000)
    await ingest.feed(sink, pcm16(tone(16000, 0.1)))  # type: ignore[arg-type]
    # the 24 kHz resampler's tail came before it: nothing of either rate was lost
    assert sink.samples_in == 16000 + 16000 + 1600


async def test_audio_past_the_session_limit_is_refused_whole() -> None:
    sink = Sink()
    ingest = PcmIngest(16000, max_seconds=1.0)
    assert await ingest.feed(sink, pcm16(tone(16000, 0.75)))  # type: ignore[arg-type]
    assert not await ingest.feed(sink, pcm16(tone(16000, 0.5)))  # type: ignore[arg-type]
    assert sink.samples_in == 12000  # nothing of the refused message was fed
    assert await ingest.feed(sink, pcm16(tone(16000, 0.25)))  # type: ignore[arg-type]
    assert sink.samples_in == 16000


async def test_g711_is_decoded_then_resampled_like_8_khz_pcm() -> None:
    """μ-law and A-law bytes (one a sample) give the 16 kHz audio 8 kHz PCM gives, within
    G.711's quantisation; a switch of encoding mid-session takes effect."""
    from qwen3_asr_server.audio import g711

    audio = tone(8000, 1.0)
    pcm_sink = Sink()
    await PcmIngest(8000, max_seconds=10).feed(pcm_sink, pcm16(audio))  # type: ignore[arg-type]
    reference = np.concatenate(pcm_sink.fed)
    for law in ("mulaw", "alaw"):
        sink = Sink()
        ingest = PcmIngest(8000, max_seconds=10, encoding=law)  # type: ignore[arg-type]
        data = g711.encode(audio, law)  # type: ignore[arg-type]
        assert len(data) == 8000
        for i in range(0, len(data), 800):
            assert await ingest.feed(sink, data[i : i + 800])  # type: ignore[arg-type]
        fed = np.concatenate(sink.fed)
        assert abs(len(fed) - len(reference)) <= 160
        n = min(len(fed), len(reference))
        assert np.abs(fed[:n] - reference[:n]).max() < 0.02  # 8-bit log quantisation
    ingest = PcmIngest(24000, max_seconds=10)
    ingest.set_rate(8000, "mulaw")
    sink = Sink()
    assert await ingest.feed(sink, g711.encode(audio, "mulaw"))  # type: ignore[arg-type]
    assert ingest.encoding == "mulaw" and sum(map(len, sink.fed)) > 0


async def test_odd_sized_messages_keep_every_sample_aligned() -> None:
    """A message may end in the middle of a sample: its byte waits for the next message
    (issue 41: it was dropped, and every later sample was misaligned)."""
    audio = tone(16000, 1.0)
    data = pcm16(audio)
    sink = Sink()
    ingest = PcmIngest(16000, max_seconds=10)
    for i in range(0, len(data), 3201):
        assert await ingest.feed(sink, data[i : i + 3201])  # type: ignore[arg-type]
    assert np.array_equal(np.concatenate(sink.fed), PcmIngest(16000, 10).decode(data))
    assert sink.samples_in == len(audio)


async def test_drain_passes_on_what_the_resampler_held() -> None:
    """1.0 s at 8 kHz in 100 ms messages is exactly 1.0 s at 16 kHz once drained (issue 41:
    ~66 ms stayed in the resampler, moved into the next item or was lost at the end)."""
    sink = Sink()
    ingest = PcmIngest(8000, max_seconds=10)
    for _ in range(10):
        await ingest.feed(sink, pcm16(tone(8000, 0.1)))  # type: ignore[arg-type]
    assert sink.samples_in < 16000  # held back: what the drain is for
    await ingest.drain(sink)  # type: ignore[arg-type]
    assert sink.samples_in == 16000
    for _ in range(10):  # the resampler starts afresh: the next second is exact too
        await ingest.feed(sink, pcm16(tone(8000, 0.1)))  # type: ignore[arg-type]
    await ingest.drain(sink)  # type: ignore[arg-type]
    assert sink.samples_in == 32000


async def test_a_drain_keeps_half_a_sample_for_the_next_message() -> None:
    sink = Sink()
    ingest = PcmIngest(16000, max_seconds=10)
    data = pcm16(tone(16000, 0.01))  # 160 samples
    await ingest.feed(sink, data[:101])  # type: ignore[arg-type]
    await ingest.drain(sink)  # type: ignore[arg-type]
    await ingest.feed(sink, data[101:])  # type: ignore[arg-type]
    assert sink.samples_in == 160


async def test_clear_drops_what_was_held() -> None:
    sink = Sink()
    ingest = PcmIngest(8000, max_seconds=10)
    await ingest.feed(sink, pcm16(tone(8000, 0.1))[:-1])  # type: ignore[arg-type]
    ingest.clear()
    await ingest.drain(sink)  # type: ignore[arg-type]
    fed = sink.samples_in
    await ingest.feed(sink, pcm16(tone(8000, 0.1)))  # type: ignore[arg-type]
    await ingest.drain(sink)  # type: ignore[arg-type]
    assert sink.samples_in - fed == 1600  # no stale half sample shifted the new audio


def interleaved(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    return np.stack([left, right], axis=1).reshape(-1)


async def test_stereo_pcm_cut_anywhere_comes_out_as_two_aligned_columns() -> None:
    """Interleaved s16le frames (4 bytes) sent in messages of odd sizes that split samples
    and frames: each channel comes out whole and in its own column (issue 44)."""
    sink = Sink()
    ingest = PcmIngest(16000, max_seconds=10, channels=2)
    left, right = tone(16000, 0.5), -0.5 * tone(16000, 0.5)
    data = pcm16(interleaved(left, right))
    for i in range(0, len(data), 1003):  # 1003 bytes: 250 frames and 3 bytes of the next
        assert await ingest.feed(sink, data[i : i + 1003])  # type: ignore[arg-type]
    fed = np.concatenate(sink.fed)
    assert fed.shape == (8000, 2) and sink.samples_in == 8000  # frames, not samples
    assert np.allclose(fed[:, 0], left, atol=4 / 32768)
    assert np.allclose(fed[:, 1], right, atol=4 / 32768)


async def test_stereo_g711_at_8_khz_is_resampled_per_channel() -> None:
    from qwen3_asr_server.audio import g711

    sink = Sink()
    ingest = PcmIngest(8000, max_seconds=10, encoding="mulaw", channels=2)
    left, right = tone(8000, 1.0), np.zeros(8000, np.float32)
    data = g711.encode(interleaved(left, right), "mulaw")
    for i in range(0, len(data), 801):  # odd: a frame's left byte waits for its right one
        assert await ingest.feed(sink, data[i : i + 801])  # type: ignore[arg-type]
    await ingest.drain(sink)  # type: ignore[arg-type]
    fed = np.concatenate(sink.fed)
    assert fed.shape == (16000, 2)
    assert np.abs(fed[:, 1]).max() < 0.01  # the silent channel stays silent
    loud = np.sqrt(np.mean(fed[800:-800, 0] ** 2))
    assert abs(loud - 0.3 / np.sqrt(2)) < 0.02  # the tone, resampled, on its own channel


async def test_the_session_limit_counts_stereo_frames_once() -> None:
    sink = Sink()
    ingest = PcmIngest(16000, max_seconds=1.0, channels=2)
    half = tone(16000, 0.5)
    assert await ingest.feed(sink, pcm16(interleaved(half, half)))  # type: ignore[arg-type]
    assert await ingest.feed(sink, pcm16(interleaved(half, half)))  # type: ignore[arg-type]
    assert not await ingest.feed(sink, pcm16(interleaved(half[:160], half[:160])))  # type: ignore[arg-type]
    assert sink.samples_in == 16000


async def test_a_stereo_feed_waits_for_the_channel_without_room() -> None:
    """Back-pressure counts both channels: a ChannelGroup's feed returns only once every
    channel's session took its audio, so one channel whose finals fall behind stops the
    reading of the whole stream (stand-in sessions that wait for room)."""
    import asyncio

    from qwen3_asr_server.streaming.channels import ChannelGroup

    class Lane:
        samples_in = 0

        def __init__(self) -> None:
            self.room, self.took = asyncio.Event(), asyncio.Event()
            self.fed: list[np.ndarray] = []

        async def feed(self, samples: np.ndarray) -> None:
            await self.room.wait()
            self.fed.append(samples)
            self.took.set()

    free, full = Lane(), Lane()
    free.room.set()
    group = ChannelGroup([free, full])  # type: ignore[list-item]
    stereo = np.stack([tone(16000, 0.2), np.zeros(3200, np.float32)], axis=1)
    feeding = asyncio.create_task(group.feed(stereo))
    await asyncio.wait_for(free.took.wait(), 10)
    assert not feeding.done() and not full.fed  # the full channel holds the stream
    full.room.set()
    await asyncio.wait_for(feeding, 10)
    assert len(free.fed[0]) == len(full.fed[0]) == 3200


async def test_large_messages_are_decoded_and_resampled_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """1 MiB of μ-law (131 s at 8 kHz) took 30-70 ms of the event loop (issue 49): G.711
    decoding and resampling run on a thread, as voice detection does. Frames keep their
    order and an odd byte its place: the stream cut into large odd-sized messages gives
    what the same bytes give converted in small messages on the loop."""
    import threading

    import soxr

    from qwen3_asr_server.audio import g711

    loop_thread = threading.current_thread()
    where: list[tuple[str, threading.Thread]] = []
    real_decode, real_stream = g711.decode, soxr.ResampleStream

    def decode(data: bytes, law: str) -> np.ndarray:
        where.append(("decode", threading.current_thread()))
        return real_decode(data, law)  # type: ignore[arg-type]

    class Stream:
        def __init__(self, *args: object, **kwargs: object) -> None:
            self.inner = real_stream(*args, **kwargs)

        def resample_chunk(self, x: np.ndarray, last: bool = False) -> np.ndarray:
            if len(x):
                where.append(("resample", threading.current_thread()))
            return self.inner.resample_chunk(x, last=last)

    rng = np.random.default_rng(0)
    audio = (0.3 * rng.standard_normal(3 * 2**20 // 2)).astype(np.float32)  # 3 MiB stereo
    data = g711.encode(audio, "mulaw")
    reference, big = Sink(), Sink()
    small = PcmIngest(8000, max_seconds=1000, encoding="mulaw", channels=2)
    for i in range(0, len(data), 4001):  # 0.25 s, odd: each ends inside a frame
        assert await small.feed(reference, data[i : i + 4001])  # type: ignore[arg-type]
    await small.drain(reference)  # type: ignore[arg-type]

    monkeypatch.setattr(g711, "decode", decode)
    monkeypatch.setattr(soxr, "ResampleStream", Stream)
    ingest = PcmIngest(8000, max_seconds=1000, encoding="mulaw", channels=2)
    cut = 2**20 + 1  # a frame's left byte waits for its right one, in the next message
    for i in range(0, len(data), cut):
        assert await ingest.feed(big, data[i : i + cut])  # type: ignore[arg-type]
    await ingest.drain(big)  # type: ignore[arg-type]

    assert {kind for kind, _ in where} == {"decode", "resample"}
    assert all(thread is not loop_thread for _, thread in where), where
    got, want = np.concatenate(big.fed), np.concatenate(reference.fed)
    assert got.shape == want.shape == (len(audio) // 2 * 2, 2)
    assert np.allclose(got, want, atol=1e-4)


async def test_a_cancelled_feed_never_blocks_the_event_loop_on_its_conversion(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review of issue 49 item 6: a feed cancelled while its message was converted on a
    thread left that thread holding the lock, and the session's release (`drain`) or a
    `clear` then took it on the event loop, which stopped until the thread was done. They
    wait for the conversion instead, in order, and the loop runs meanwhile."""
    sink = Sink()
    ingest = PcmIngest(8000, max_seconds=100)
    entered, gate, alive = threading.Event(), threading.Event(), threading.Event()
    decode = ingest.decode

    def held(data: bytes) -> np.ndarray:
        entered.set()
        gate.wait(30)
        return decode(data)

    monkeypatch.setattr(ingest, "decode", held)
    feeding = asyncio.create_task(ingest.feed(sink, pcm16(tone(8000, 1.0))))  # type: ignore[arg-type]
    assert await asyncio.to_thread(entered.wait, 30)  # converting on its thread
    feeding.cancel()
    with pytest.raises(asyncio.CancelledError):
        await feeding
    late: list[bool] = []

    def opener() -> None:  # the conversion ends once the loop has shown it still runs
        late.append(not alive.wait(5))
        gate.set()

    thread = threading.Thread(target=opener)
    thread.start()
    ingest.clear()  # after the conversion: what its resampler held is dropped
    draining = asyncio.create_task(ingest.drain(sink))  # type: ignore[arg-type]
    await asyncio.sleep(0)  # the drain starts (it took the lock here: the loop stopped)
    alive.set()
    await asyncio.wait_for(draining, 30)
    thread.join()
    assert late == [False], "the event loop was blocked while the conversion ran"
    assert sink.samples_in == 0  # the cancelled message was not fed; the clear came after
    await ingest.feed(sink, pcm16(tone(8000, 0.1)))  # type: ignore[arg-type]
    await ingest.drain(sink)  # type: ignore[arg-type]
    assert sink.samples_in == 1600
