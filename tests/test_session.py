"""StreamSession logic with real speech and the real VAD; the transcriber is a stand-in
that records its calls (the end-to-end proof is in test_ws_transcribe.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from qwen3_asr_server.streaming.session import StreamConfig, StreamSession
from qwen3_asr_server.vad import SileroModel
from streaming_client import load


class Transcriber:
    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[float] = []
        self.delay = delay
        self.in_flight = 0
        self.max_in_flight = 0

    async def __call__(self, samples: np.ndarray, language: str | None) -> str:
        self.calls.append(len(samples) / 16000)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        return f"text of {len(samples) / 16000:.2f} s"


async def run(audio: np.ndarray, transcriber: Transcriber, **config: Any) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []

    async def emit(event: dict[str, Any]) -> None:
        events.append(event)

    session = StreamSession(StreamConfig(**config), transcriber, emit, SileroModel())
    for i in range(0, len(audio), 1600):  # 100 ms chunks, paced so tasks can run
        await session.feed(audio[i : i + 1600])
        await asyncio.sleep(0.01)
    await session.close("test")
    return events


async def test_silence_costs_no_inference() -> None:
    transcriber = Transcriber()
    events = await run(np.zeros(16000 * 5, np.float32), transcriber)
    assert transcriber.calls == []
    assert events == []


async def test_one_partial_in_flight_per_session() -> None:
    transcriber = Transcriber(delay=0.5)  # slower than the partial interval
    audio = np.concatenate([load("long_2min.wav")[: 16000 * 8]])
    await run(audio, transcriber, use_vad=False)
    assert transcriber.max_in_flight <= 2  # one partial, plus at most the final at the end


async def test_end_of_speech_final_reuses_the_early_transcription() -> None:
    transcriber = Transcriber()
    audio = np.concatenate([load("sentence_02.wav"), np.zeros(16000, np.float32)])
    events = await run(audio, transcriber)
    kinds = [e["type"] for e in events]
    assert kinds.count("final") == 1 and "speech_started" in kinds and "speech_stopped" in kinds
    final = next(e for e in events if e["type"] == "final")
    assert final["reason"] == "silence"
    # the final's text is the early call's: no second transcription of the utterance
    assert final["text"] == f"text of {final['duration']:.2f} s"
    assert transcriber.calls.count(final["duration"]) == 1
    partials = [e for e in events if e["type"] == "partial"]
    assert partials and all(p["utterance"] == final["utterance"] for p in partials)


async def test_max_length_cuts_a_final_without_losing_audio() -> None:
    transcriber = Transcriber()
    audio = load("long_2min.wav")[: 16000 * 14]
    events = await run(audio, transcriber, use_vad=False, max_utterance_s=5.0)
    finals = [e for e in events if e["type"] == "final"]
    assert [f["reason"] for f in finals[:-1]] == ["max_length"] * (len(finals) - 1)
    assert all(f["duration"] <= 5.0 for f in finals[:-1])
    total = sum(f["duration"] for f in finals) - 0.6  # the last one carries the flush padding
    assert abs(total - 14.0) < 0.1
