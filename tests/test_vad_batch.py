"""The streaming sessions' VAD, batched across sessions (`audio/vad.py`), on the real Silero
ONNX model: the same probabilities as one stream at a time, fewer model calls under load,
frames of one stream kept in order, and failures reaching every caller."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qwen3_asr_server.audio.vad import CONTEXT, FRAME, MAX_FRAMES, SileroModel
from streaming_client import load


def messages(audio: np.ndarray, frames_per_message: int) -> list[np.ndarray]:
    size = frames_per_message * FRAME
    whole = len(audio) - len(audio) % size
    return [audio[i : i + size] for i in range(0, whole, size)]


def one_at_a_time(model: SileroModel, audio: np.ndarray) -> np.ndarray:
    """The reference, independent of vad.run_streams: one model call per frame, as Silero's
    own wrapper does (64 samples of context in front of each 512-sample frame)."""
    session = model.session()
    state = np.zeros((2, 1, 128), dtype=np.float32)
    context = np.zeros((1, CONTEXT), dtype=np.float32)
    out = []
    for i in range(len(audio) // FRAME):
        x = np.concatenate([context, audio[i * FRAME : (i + 1) * FRAME].reshape(1, FRAME)], 1)
        prob, state = session.run(
            None, {"input": x, "state": state, "sr": np.array(16000, dtype=np.int64)}
        )
        context = x[:, -CONTEXT:]
        out.append(float(prob.reshape(-1)[0]))
    return np.array(out, dtype=np.float32)


def test_batched_probabilities_equal_one_stream_at_a_time() -> None:
    """Eight streams, each a different offset of real speech and a different message size,
    fed concurrently: each stream's probabilities are exactly what its own calls give, and
    the batcher needed far fewer model calls than there were frames."""
    model = SileroModel()
    speech = load("three_sentences.wav")[: 16000 * 6]
    clips = [np.roll(speech, i * 7919) for i in range(8)]
    sizes = [1, 2, 3, 1, 5, 2, 3, 4]  # frames per message (100 ms is ~3 frames)

    async def feed(clip: np.ndarray, size: int) -> np.ndarray:
        stream = model.stream()
        out = [await model.batcher.probs(stream, m) for m in messages(clip, size)]
        return np.concatenate(out)

    async def run_all() -> list[np.ndarray]:
        return list(await asyncio.gather(*(feed(c, s) for c, s in zip(clips, sizes, strict=True))))

    try:
        got = asyncio.run(run_all())
        stats = model.batcher.stats()
        for clip, size, probs in zip(clips, sizes, got, strict=True):
            expected = one_at_a_time(model, clip[: len(probs) * FRAME])
            assert len(probs) == len(clip) // (size * FRAME) * size
            np.testing.assert_allclose(probs, expected, atol=1e-5)
        every = np.concatenate(got)
        assert every.max() > 0.9 and every.min() < 0.1  # real speech and its pauses
        assert stats.calls < stats.frames / 2  # streams waiting for a run shared its calls
        assert stats.frames == sum(len(p) for p in got)
        assert stats.seconds > 0 and stats.waiting == 0
    finally:
        model.close()


def test_two_requests_of_one_stream_run_in_order() -> None:
    """A stream with a second request waiting (never sent by a session, but possible) has it
    deferred to the next batch: the recurrent state sees the frames in order."""
    model = SileroModel()
    audio = load("three_sentences.wav")[: 40 * FRAME]

    async def both() -> np.ndarray:
        stream = model.stream()
        first = model.batcher.probs(stream, audio[: 20 * FRAME])
        second = model.batcher.probs(stream, audio[20 * FRAME :])
        a, b = await asyncio.gather(first, second)
        return np.concatenate([a, b])

    try:
        np.testing.assert_allclose(asyncio.run(both()), one_at_a_time(model, audio), atol=1e-5)
    finally:
        model.close()


def test_a_model_that_cannot_load_fails_every_caller_and_the_next_batch_runs(
    tmp_path: Path,
) -> None:
    model = SileroModel(tmp_path / "missing.onnx")

    async def run() -> list[object]:
        streams = [model.stream() for _ in range(3)]
        frames = np.zeros(3 * FRAME, dtype=np.float32)
        first = await asyncio.gather(
            *(model.batcher.probs(s, frames) for s in streams), return_exceptions=True
        )
        with pytest.raises(Exception) as again:  # the batcher is not stuck: it runs again
            await asyncio.wait_for(model.batcher.probs(streams[0], frames), 30)
        return [*first, again.value]

    try:
        errors = asyncio.run(run())
        assert len(errors) == 4
        assert all("missing.onnx" in str(e) for e in errors)  # each caller hears why
    finally:
        model.close()


def test_a_cancelled_caller_does_not_stop_the_others() -> None:
    model = SileroModel()
    audio = load("three_sentences.wav")[: 30 * FRAME]

    async def run() -> np.ndarray:
        a, b = model.stream(), model.stream()
        gone = asyncio.ensure_future(model.batcher.probs(a, audio))
        kept = asyncio.ensure_future(model.batcher.probs(b, audio))
        await asyncio.sleep(0)
        gone.cancel()
        result = await kept
        with pytest.raises(asyncio.CancelledError):
            await gone
        return result

    try:
        np.testing.assert_allclose(asyncio.run(run()), one_at_a_time(model, audio), atol=1e-5)
    finally:
        model.close()


def test_a_long_message_goes_in_pieces_and_lets_other_streams_through() -> None:
    """A message of 10 s (313 frames, say a minute of G.711 in one WebSocket frame) runs in
    pieces of MAX_FRAMES frames, one per batch: a short request from another stream is
    answered before the long one ends, and the long one's numbers are unchanged."""
    model = SileroModel()
    speech = load("three_sentences.wav")
    long, short = speech[: 16000 * 10], speech[16000 * 10 : 16000 * 10 + 3 * FRAME]
    order: list[str] = []

    async def run() -> np.ndarray:
        async def tagged(name: str, stream: Any, audio: np.ndarray) -> np.ndarray:
            result = await model.batcher.probs(stream, audio)
            order.append(name)
            return result

        a, b = model.stream(), model.stream()
        first = asyncio.ensure_future(tagged("long", a, long))
        await asyncio.sleep(0)  # the long message is in the first batch
        second = asyncio.ensure_future(tagged("short", b, short))
        got, _ = await asyncio.gather(first, second)
        return got

    try:
        got = asyncio.run(run())
        assert len(long) // FRAME > 3 * MAX_FRAMES
        np.testing.assert_allclose(got, one_at_a_time(model, long), atol=1e-5)
        assert order == ["short", "long"]
    finally:
        model.close()


def test_callers_waiting_when_the_vad_stops_get_an_error_not_a_hang() -> None:
    """Shutdown: the VAD's threads stop with requests queued; each caller gets an error
    (VADStopped, or the executor's "cannot schedule new futures after shutdown") instead of
    waiting for ever or a CancelledError it never asked for."""
    model = SileroModel()
    audio = np.zeros(3 * FRAME, dtype=np.float32)

    async def run() -> list[BaseException | np.ndarray]:
        streams = [model.stream() for _ in range(4)]
        calls = [asyncio.ensure_future(model.batcher.probs(s, audio)) for s in streams]
        await asyncio.sleep(0)  # the drain task takes the batch
        model.close()  # (cancel_futures: what the app's shutdown does)
        return list(await asyncio.gather(*calls, return_exceptions=True))

    results = asyncio.run(run())
    for r in results:  # a batch already running may finish; none hangs or is cancelled
        assert isinstance(r, (np.ndarray, RuntimeError)), repr(r)  # VADStopped is one
