"""Live speakers in the session core (issue 51), on a fake fingerprint service: a final
waits a bounded time for its speaker, a flush or reset that comes meanwhile is answered by
it, and a final whose voice changes is split. The real child and real voices are in
tests/test_live_speakers.py."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from qwen3_asr_server.audio.vad import SileroModel
from qwen3_asr_server.streaming.events import Final, StreamEvent
from qwen3_asr_server.streaming.session import StreamConfig, StreamSession
from test_session import Transcriber

RATE = 16000
rng = np.random.default_rng(3)
VOICE_A, VOICE_B = (v / np.linalg.norm(v) for v in rng.normal(size=(2, 192)))


class Voices:
    """Fingerprints by the sign of a clip's mean: positive is voice A, negative voice B.
    `gate` holds every answer until it is set."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.gate.set()
        self.missing: list[str] = []
        self.opened = 0

    async def embed(self, clips: list[np.ndarray]) -> np.ndarray:
        await self.gate.wait()
        return np.stack([VOICE_A if float(np.mean(c)) > 0 else VOICE_B for c in clips])

    async def ready(self) -> None:
        return None

    def missed(self, reason: str) -> None:
        self.missing.append(reason)

    def open(self) -> None:
        self.opened += 1

    def close(self) -> None:
        self.opened -= 1


def session(voices: Voices, events: list[StreamEvent], **config: Any) -> StreamSession:
    async def emit(event: StreamEvent) -> None:
        events.append(event)

    cfg = StreamConfig(use_vad=False, diarize=True, **config)
    return StreamSession(cfg, Transcriber(), emit, SileroModel(), voices=voices)


def finals(events: list[StreamEvent]) -> list[Final]:
    return [e for e in events if isinstance(e, Final)]


async def until(condition: Any) -> None:
    while not condition():
        await asyncio.sleep(0.005)


async def test_a_flush_sent_while_a_final_waits_for_its_speaker_is_answered_by_it() -> None:
    voices, events = Voices(), []
    s = session(voices, events, speaker_wait_s=5.0)
    voices.gate.clear()
    await s.feed(np.full(2 * RATE, 0.1, np.float32))
    await s.flush()
    await asyncio.sleep(0.05)  # its text is ready; its speaker is not
    assert not finals(events)
    assert s.answer_pending("flush")  # answered by that final, not by an empty one now
    voices.gate.set()
    await until(lambda: finals(events))
    (final,) = finals(events)
    assert final.speaker == "A" and final.answers == ("flush",) and final.reason == "flush"
    await s.close("test")
    assert voices.opened == 0


async def test_a_final_waits_for_its_speaker_at_most_the_wait_then_goes_without() -> None:
    voices, events = Voices(), []
    s = session(voices, events, speaker_wait_s=0.1)
    voices.gate.clear()
    await s.feed(np.full(2 * RATE, 0.1, np.float32))
    await s.flush()
    await until(lambda: finals(events))
    (final,) = finals(events)
    assert final.diarized and final.speaker is None and final.text
    assert voices.missing and "slow" in voices.missing[0]
    voices.gate.set()  # the late fingerprint still teaches the stream its voice
    await until(lambda: s._finals.labels is not None and s._finals.labels.speakers.voices)
    await s.feed(np.full(2 * RATE, 0.1, np.float32))
    await s.flush()
    await until(lambda: len(finals(events)) == 2)
    assert finals(events)[1].speaker == "A"
    await s.close("test")


async def test_a_final_whose_voice_changes_is_split_with_its_times() -> None:
    voices, events = Voices(), []
    s = session(voices, events, flush_silence_ms=0)
    first, second = np.full(4 * RATE, 0.1, np.float32), np.full(4 * RATE, -0.1, np.float32)
    await s.feed(np.concatenate([first, second]))
    await s.flush()
    await until(lambda: len(finals(events)) == 2)
    a, b = finals(events)
    assert (a.speaker, b.speaker) == ("A", "B")
    assert a.start == 0.0 and abs(a.end - 4.0) <= 0.3 and b.start == a.end and b.end == 8.0
    assert a.answers == () and b.answers == () and a.utterance == b.utterance
    assert a.text == f"text of {a.end - a.start:.2f} s"  # each part transcribed alone
    await s.close("test")


async def test_without_diarize_finals_carry_times_and_no_speaker() -> None:
    events: list[StreamEvent] = []

    async def emit(event: StreamEvent) -> None:
        events.append(event)

    s = StreamSession(StreamConfig(use_vad=False), Transcriber(), emit, SileroModel())
    for _ in range(2):
        await s.feed(np.full(RATE, 0.1, np.float32))
        await s.flush()
    await until(lambda: len(finals(events)) == 2)
    assert not any(f.diarized or f.speaker for f in finals(events))
    assert [(f.start, f.end) for f in finals(events)] == [(0.0, 1.0), (1.0, 2.0)]
    await s.close("test")


async def test_a_config_while_a_final_waits_for_known_speakers_stops_no_final() -> None:
    """Issue 58 §2.1: a config that turned diarize off or changed the known speakers,
    sent while a final waited for the known speakers' fingerprints, cancelled them through
    `asyncio.shield`, and the CancelledError ended the session's finals for good: no final,
    no flush answer, nothing logged. Now that final goes on, and so do the next ones."""
    from qwen3_asr_server.streaming.speakers import KnownVoice

    for change in ("diarize off", "new known speakers"):
        voices, events = Voices(), []
        s = session(voices, events, speaker_wait_s=30.0)
        s.know([KnownVoice("Ann", np.full(3 * RATE, 0.1, np.float32))])
        voices.gate.clear()  # the child is cold: nothing is fingerprinted yet
        await s.feed(np.full(2 * RATE, 0.1, np.float32))
        await s.flush()
        await asyncio.sleep(0.05)  # its text is ready; it waits for the known speakers
        assert not finals(events)
        if change == "diarize off":
            s.configure(diarize=False)
        else:
            s.know([KnownVoice("Bob", np.full(3 * RATE, -0.1, np.float32))])
        voices.gate.set()
        await asyncio.wait_for(until(lambda: len(finals(events)) == 1), 10)  # noqa: B023
        await s.feed(np.full(2 * RATE, -0.1, np.float32))
        await s.flush()  # the session's finals go on
        await asyncio.wait_for(until(lambda: len(finals(events)) == 2), 10)  # noqa: B023
        first, second = finals(events)
        assert first.reason == second.reason == "flush", change
        if change == "diarize off":
            assert second.speaker is None
        else:
            assert (first.speaker, second.speaker) == ("A", "Bob")  # Ann was forgotten
        await s.close("test")


async def test_a_fingerprint_that_fails_after_its_stream_ended_is_not_reported_as_lost() -> None:
    """Issue 58 §2.8: at shutdown, "Task exception was never retrieved" from the fingerprint
    tasks of finals that no longer waited for them."""
    import gc

    from qwen3_asr_server.streaming.speakers import SpeakerLabels

    class Failing(Voices):
        async def embed(self, clips: list[np.ndarray]) -> np.ndarray:
            raise RuntimeError("the child is gone")

    reports: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: reports.append(context))
    try:
        labels = SpeakerLabels(Failing(), wait_s=1.0)
        task = labels.fingerprint(np.full(2 * RATE, 0.1, np.float32))
        await asyncio.wait([task])
        labels.close()
        del task
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert reports == []
