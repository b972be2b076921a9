"""The streaming sessions' VAD, batched across sessions (vad_batch.py), on the real Silero
ONNX model: the same probabilities as one stream at a time, fewer model calls under load,
frames of one stream kept in order, and failures reaching every caller."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from qwen3_asr_server.vad import FRAME, SileroModel
from streaming_client import load


def messages(audio: np.ndarray, frames_per_message: int) -> list[np.ndarray]:
    size = frames_per_message * FRAME
    whole = len(audio) - len(audio) % size
    return [audio[i : i + size] for i in range(0, whole, size)]


def one_at_a_time(model: SileroModel, audio: np.ndarray) -> np.ndarray:
    return model.stream().probs(audio)


def test_batched_probabilities_equal_one_stream_at_a_time() -> None:
    """Eight streams, each a different offset of real speech and a different message size,
    fed concurrently: each stream's probabilities are exactly what its own calls give, and
    the batcher needed far fewer model calls than there were messages."""
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
        total_messages = sum(len(messages(c, s)) for c, s in zip(clips, sizes, strict=True))
        assert stats.batches < total_messages / 2  # requests waiting for a run went together
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
