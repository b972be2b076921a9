"""A 1-hour file must not be copied per segment: segments are views of one array."""

from __future__ import annotations

import asyncio
import tracemalloc
from typing import Any

import numpy as np

from qwen3_asr_server.audio.decode import Audio
from qwen3_asr_server.audio.segmentation import Segmenter
from qwen3_asr_server.config import Settings
from qwen3_asr_server.engines.base import TranscribeRequest, TranscribeResult
from qwen3_asr_server.runtime.lifecycle import ModelManager
from qwen3_asr_server.runtime.scheduler import PriorityScheduler
from qwen3_asr_server.transcript import Segment
from qwen3_asr_server.transcription.service import Options, Transcriber


class EchoEngine:
    """Stands in for the model: this test is about the service's memory, not the words."""

    name, model_id, device, languages = "echo", "echo", "cpu", None
    long_form_batches = False

    def load(self) -> None: ...

    def unload(self) -> None: ...

    def transcribe(self, request: TranscribeRequest, should_stop: Any = None) -> TranscribeResult:
        assert request.audio.base is not None  # a view into the upload, not a copy
        seconds = len(request.audio) / 16000
        return TranscribeResult("word", "en", [Segment(0, seconds, "word")])

    def batch_key(self, request: TranscribeRequest) -> None:
        return None

    def transcribe_batch(
        self, requests: list[TranscribeRequest], should_stop: Any = None
    ) -> list[TranscribeResult]:
        return [self.transcribe(r) for r in requests]


async def test_one_hour_is_streamed_in_views_with_bounded_extra_memory() -> None:
    samples = np.random.default_rng(0).normal(0, 0.01, 3600 * 16000).astype(np.float32)
    settings = Settings(_env_file=None, idle_timeout=0)  # type: ignore[call-arg]
    scheduler = PriorityScheduler(max_queue=4)
    scheduler.start()
    manager = ModelManager(EchoEngine(), idle_timeout=0)  # type: ignore[arg-type]
    service = Transcriber(settings, manager, scheduler, Segmenter(30, vad=None))
    tracemalloc.start()
    try:
        count = 0
        async for part in service.stream(Audio(samples, 16000), Options()):
            count += 1
            assert part.span.end - part.span.start <= 30 * 16000
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await asyncio.to_thread(scheduler.stop)
    assert count >= 120
    audio_mb = samples.nbytes / 1e6
    assert peak / 1e6 < 20, f"peak extra {peak / 1e6:.1f} MB for a {audio_mb:.0f} MB file"
