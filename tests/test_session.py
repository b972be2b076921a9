"""StreamSession logic with real speech and the real VAD; the transcriber is a stand-in
that records its calls (the end-to-end proof is in test_ws_transcribe.py)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import numpy as np
from loguru import logger

from qwen3_asr_server.audio.vad import FRAME, SileroModel
from qwen3_asr_server.streaming.agreement import Draft, LocalAgreement
from qwen3_asr_server.streaming.channels import ChannelGroup
from qwen3_asr_server.streaming.config import Heard
from qwen3_asr_server.streaming.events import (
    Committed,
    Final,
    Partial,
    SpeechStarted,
    SpeechStopped,
    StreamEvent,
)
from qwen3_asr_server.streaming.finals import Finals, PendingFinal
from qwen3_asr_server.streaming.registry import SessionRegistry
from qwen3_asr_server.streaming.session import StreamConfig, StreamSession
from qwen3_asr_server.streaming.utterance import Utterance
from streaming_client import load


class Transcriber:
    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[float] = []
        self.delay = delay
        self.in_flight = 0
        self.max_in_flight = 0

    async def __call__(self, audio: Any, language: str | None, partial: bool = False) -> str:
        samples = audio() if callable(audio) else audio
        self.calls.append(len(samples) / 16000)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        return f"text of {len(samples) / 16000:.2f} s"


async def run(audio: np.ndarray, transcriber: Transcriber, **config: Any) -> list[StreamEvent]:
    events: list[StreamEvent] = []

    async def emit(event: StreamEvent) -> None:
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
    kinds = [type(e) for e in events]
    assert kinds.count(Final) == 1 and SpeechStarted in kinds and SpeechStopped in kinds
    final = finals_of(events)[0]
    assert final.reason == "silence"
    # the final's text is the early call's: no second transcription of the utterance
    assert final.text == f"text of {final.duration:.2f} s"
    assert transcriber.calls.count(final.duration) == 1
    partials = partials_of(events)
    assert partials and all(p.utterance == final.utterance for p in partials)


async def test_max_length_cuts_a_final_without_losing_audio() -> None:
    transcriber = Transcriber()
    audio = load("long_2min.wav")[: 16000 * 14]
    events = await run(audio, transcriber, use_vad=False, max_utterance_s=5.0)
    finals = finals_of(events)
    assert [f.reason for f in finals[:-1]] == ["max_length"] * (len(finals) - 1)
    assert all(f.duration <= 5.0 for f in finals[:-1])
    total = sum(f.duration for f in finals)  # the client's audio: no flush padding
    assert abs(total - 14.0) < 0.05


def finals_of(events: list[StreamEvent]) -> list[Final]:
    return [e for e in events if isinstance(e, Final)]


def partials_of(events: list[StreamEvent]) -> list[Partial]:
    return [e for e in events if isinstance(e, Partial)]


class Cancellable(Transcriber):
    """Records transcriptions that were cancelled before they finished."""

    def __init__(self, delay: float) -> None:
        super().__init__(delay)
        self.cancelled: list[float] = []
        self.finished: list[float] = []

    async def __call__(self, audio: Any, language: str | None, partial: bool = False) -> str:
        length = len(audio() if callable(audio) else audio) / 16000
        try:
            text = await super().__call__(audio, language, partial)
        except asyncio.CancelledError:
            self.cancelled.append(length)
            raise
        self.finished.append(length)
        return text


def session_with(transcriber: Any, events: list[StreamEvent], **config: Any) -> StreamSession:
    async def emit(event: StreamEvent) -> None:
        events.append(event)

    return StreamSession(StreamConfig(**config), transcriber, emit, SileroModel())


async def test_flush_cancels_the_early_final_instead_of_orphaning_it() -> None:
    transcriber = Cancellable(delay=0.5)
    events: list[StreamEvent] = []
    session = session_with(transcriber, events, end_silence_ms=3000)
    await session.feed(load("sentence_02.wav"))
    for _ in range(30):  # silence until the early final starts
        await session.feed(np.zeros(1600, np.float32))
        if session._early is not None:
            break
    assert session._early is not None
    await asyncio.sleep(0.05)  # the early transcription has started
    early_length = session._early_len / 16000
    await session.flush()
    await session.close("test")
    await asyncio.sleep(0)
    orphans = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    assert orphans == []  # the early transcription was cancelled, not left running
    await asyncio.sleep(0.6)  # an orphaned early transcription would have finished by now
    assert early_length not in transcriber.finished  # the stale transcription never ran on
    finals = finals_of(events)
    assert len(finals) == 1 and finals[0].reason == "flush"


class Fixed(Transcriber):
    async def __call__(self, audio: Any, language: str | None, partial: bool = False) -> str:
        await super().__call__(audio, language, partial)
        return "alpha beta gamma"


async def test_max_length_cut_starts_the_next_utterance_with_no_stable_text() -> None:
    events = await run(
        load("long_2min.wav")[: 16000 * 9], Fixed(), use_vad=False, max_utterance_s=5.0
    )
    partials = partials_of(events)
    second = [p for p in partials if p.utterance == 2]
    assert any(p.stable_text for p in partials if p.utterance == 1)
    assert second, "the second utterance had partials"
    assert second[0].stable_text == ""  # one hypothesis agrees with nothing yet


async def test_event_times_are_right_when_one_message_holds_many_frames() -> None:
    speech = load("sentence_02.wav")
    audio = np.concatenate([np.zeros(32000, np.float32), speech, np.zeros(16000, np.float32)])
    events: list[StreamEvent] = []
    session = session_with(Transcriber(), events, prefix_padding_ms=300)
    await session.feed(audio)  # one message: every frame of it at once
    await session.close("test")
    started = next(e for e in events if isinstance(e, SpeechStarted))
    stopped = next(e for e in events if isinstance(e, SpeechStopped))
    # Speech begins at 2000 ms; the utterance starts up to 300 ms of padding earlier.
    assert 1600 <= started.at_ms <= 2200
    end_of_speech = (32000 + len(speech)) * 1000 // 16000
    assert end_of_speech - 1000 <= stopped.at_ms <= end_of_speech + 800


async def test_audio_waiting_for_finals_is_bounded_by_back_pressure() -> None:
    transcriber = Transcriber(delay=0.3)
    events: list[StreamEvent] = []
    session = session_with(
        transcriber, events, use_vad=False, max_utterance_s=5.0, max_pending_s=6.0
    )
    audio = load("long_2min.wav")[: 16000 * 40]
    most = 0.0
    for i in range(0, len(audio), 16000):  # as fast as the session takes it
        await session.feed(audio[i : i + 16000])
        most = max(most, session.pending_seconds)
    await session.close("test")
    assert most <= 6.0 + 5.0  # the bound, plus one utterance committed past it
    finals = finals_of(events)
    total = sum(f.duration for f in finals)  # nothing lost (the client's audio only)
    assert abs(total - 40.0) < 0.05


async def test_vad_of_a_big_message_does_not_stall_the_event_loop() -> None:
    events: list[StreamEvent] = []
    session = session_with(Transcriber(), events)
    audio = load("long_2min.wav")[: 16000 * 33]  # ~1 MiB of PCM in one message
    await session.feed(np.zeros(512, np.float32))  # the ONNX session is loaded
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while not done.is_set():
            await asyncio.sleep(0.005)
            now = loop.time()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    await session.feed(audio)
    done.set()
    await tick
    await session.close("test")
    assert max(gaps) < 0.1


async def test_clear_cancels_the_early_final_of_the_cleared_audio() -> None:
    transcriber = Cancellable(delay=0.5)
    events: list[StreamEvent] = []
    session = session_with(transcriber, events, end_silence_ms=3000)
    await session.feed(load("sentence_02.wav"))
    for _ in range(30):
        await session.feed(np.zeros(1600, np.float32))
        if session._early is not None:
            break
    assert session._early is not None
    await asyncio.sleep(0.05)
    early_length = session._early_len / 16000
    session.clear()
    assert session._early is None
    await asyncio.sleep(0.6)
    assert early_length in transcriber.cancelled
    await session.close("test")
    assert finals_of(events) == []


class Words(Transcriber):
    """Answers a fixed sentence, so partial texts can be checked."""

    async def __call__(self, audio: Any, language: str | None, partial: bool = False) -> str:
        await super().__call__(audio, language, partial)
        return "one two three four"


async def test_the_first_partial_comes_after_0_3_s_of_speech() -> None:
    """Whatever the partial interval: with 2 s, the first partial still reads well under a
    second of audio (pre-roll + ~0.3 s of speech), the second one ~2 s later."""
    transcriber = Transcriber()
    audio = np.concatenate([load("three_sentences.wav")])
    events = await run(audio, transcriber, partial_interval_s=2.0)
    assert partials_of(events)
    first, second = transcriber.calls[:2]
    assert first < 1.0, first
    assert second - first > 1.5, (first, second)


async def test_partials_hold_back_their_last_word() -> None:
    transcriber = Words()
    events = await run(load("sentence_02.wav"), transcriber)
    partials = partials_of(events)
    assert partials[0].text == "one two three"
    # until all four words are stable, the last one is held back
    assert all(p.text in ("one two three", p.stable_text) for p in partials)
    assert all(p.text.startswith(p.stable_text) for p in partials)
    final = finals_of(events)[0]
    assert final.text == "one two three four"  # the final has every word


def test_held_back_keeps_one_word_and_the_stable_text() -> None:
    from qwen3_asr_server.streaming.agreement import held_back

    assert held_back("Hello", "") == "Hello"
    assert held_back("Hello there you", "") == "Hello there"
    assert held_back("Hello there", "Hello there") == "Hello there"
    assert held_back("", "") == ""
    assert held_back("The", "The Wig Round") == "The Wig Round"  # never less than stable
    # a hypothesis that rewrites a stable word: the stable word stays, the rest follows
    assert held_back("But weather today is", "The") == "The weather today"


class Drafts(Transcriber):
    """Partials come back as drafts whose second word is unsure; finals as text."""

    async def __call__(self, audio: Any, language: str | None, partial: bool = False) -> Any:
        await super().__call__(audio, language, partial)
        if not partial:
            return "one two three four"
        return Draft([("one", 0.9), ("two", 0.1), ("three", 0.9), ("four", 0.9)])


async def test_after_the_first_partial_only_confident_words_are_shown() -> None:
    events = await run(load("sentence_02.wav"), Drafts())
    partials = [p.text for p in partials_of(events)]
    # The first shows the whole draft (early), later ones stop before the unsure word, and
    # a partial that would repeat the last one is not sent.
    assert partials == ["one two three", "one"]
    assert [f.text for f in finals_of(events)] == ["one two three four"]


def test_a_draft_stops_at_an_unsure_word_and_at_a_restart() -> None:
    sure = [("Please", 0.9), ("call", 0.8), ("me...", 0.7), ("Please", 0.9), ("call", 0.9)]
    assert Draft(sure).confident_text(0.5) == "Please call me..."
    again = [("Please", 0.9), ("call", 0.8), ("me", 0.7), ("please", 0.9), ("call", 0.9)]
    assert Draft(again).confident_text(0.5) == "Please call me"
    assert Draft([("The", 0.9), ("cat", 0.4), ("sat", 0.9)]).confident_text(0.5) == "The"
    assert Draft([("The", 0.2), ("cat", 0.9)]).confident_text(0.5) == ""
    assert Draft([("The", 0.2), ("cat", 0.9)]).confident_text(0.0) == "The cat"
    # a word that comes back later is no restart unless the opening pair does
    words = [("The", 0.9), ("train", 0.9), ("to", 0.9), ("the", 0.9), ("city", 0.9)]
    assert Draft(words).confident_text(0.5) == "The train to the city"


class Settling(Transcriber):
    """Partials: a sure three-word draft, then the same with an unsure last word. The second
    partial's text equals the first (held back), but its stable text has grown."""

    async def __call__(self, audio: Any, language: str | None, partial: bool = False) -> Any:
        await super().__call__(audio, language, partial)
        if not partial:
            return "one two three"
        sure = sum(1 for _ in self.calls) <= 1
        return Draft([("one", 0.9), ("two", 0.9), ("three", 0.9 if sure else 0.1)])


async def test_a_partial_whose_stable_text_grew_is_sent() -> None:
    events = await run(load("sentence_02.wav"), Settling())
    partials = [(p.text, p.stable_text) for p in partials_of(events)]
    assert partials[:2] == [("one two", ""), ("one two", "one two")], partials


async def test_the_final_starts_as_the_silence_begins() -> None:
    """The final's transcription starts within two VAD frames (64 ms) of silence, so it is
    done by the time the silence that ends the utterance (500 ms) is."""
    events: list[StreamEvent] = []

    async def emit(event: StreamEvent) -> None:
        events.append(event)

    session = StreamSession(StreamConfig(), Transcriber(), emit, SileroModel())
    audio = np.concatenate([load("sentence_02.wav"), np.zeros(16000, np.float32)])
    started_after: list[int] = []  # samples of silence when an early final started
    for i in range(0, len(audio), FRAME):
        await session.feed(audio[i : i + FRAME])
        if session._early is not None and not started_after:
            started_after.append(session.turns.silence)
    await session.close("test")
    assert started_after and started_after[0] <= 2 * FRAME
    assert [f.reason for f in finals_of(events)] == ["silence"]


def test_stable_text_only_grows() -> None:
    """A word, once agreed, stays: a later pair of hypotheses that agrees on a different
    start does not replace it (it did: "The quick" became "A quick brown fox")."""
    agreement = LocalAgreement()
    seen = [
        agreement.update(h)
        for h in [
            "The quick",
            "The quick brown",
            "A quick brown fox",
            "A quick brown fox jumps",
            "The quick brown fox",
            "The quick brown fox jumps",
        ]
    ]
    assert seen == ["", "The quick", "The quick", "The quick", "The quick", "The quick brown fox"]
    rng = np.random.default_rng(7)
    words = ["a", "the", "quick", "brown", "fox"]
    agreement.reset()
    stable = ""
    for _ in range(500):  # random hypotheses: every stable text extends the one before
        hypothesis = " ".join(rng.choice(words, rng.integers(0, 6)))
        new = agreement.update(hypothesis)
        assert new.startswith(stable)
        stable = new


async def test_a_final_counts_the_clients_audio_not_the_padding() -> None:
    """Realtime's usage.seconds comes from `duration`: 3.84 s of audio is 3.84 s, not 4.44 s
    with the commit's silence padding (nor the last frame's zero fill)."""
    events: list[StreamEvent] = []
    session = session_with(Transcriber(), events, use_vad=False)
    await session.feed(load("long_2min.wav")[: int(16000 * 3.84) + 100])
    await session.flush("commit")
    await session.close("test")
    finals = finals_of(events)
    assert len(finals) == 1
    assert finals[0].duration == (int(16000 * 3.84) + 100) / 16000


class Gated(Transcriber):
    """Finals wait for `gate`; partials return at once."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.final_started = asyncio.Event()

    async def __call__(self, audio: Any, language: str | None, partial: bool = False) -> str:
        if partial:
            return await super().__call__(audio, language, partial)
        self.final_started.set()
        await self.gate.wait()
        return ""  # an utterance of noise: its final is empty


async def test_a_flush_while_a_final_is_pending_is_answered_by_that_final() -> None:
    """Voice detection closed the utterance and its final is still running: the flush is
    answered by that final, in order (sent even though empty), not by an empty final ahead
    of it."""
    events: list[StreamEvent] = []
    transcriber = Gated()
    session = session_with(transcriber, events)
    await session.feed(np.concatenate([load("sentence_02.wav"), np.zeros(16000, np.float32)]))
    await asyncio.wait_for(transcriber.final_started.wait(), 30)
    assert [type(e) for e in events if isinstance(e, Committed)] == [Committed]
    assert await session.flush() is None  # nothing buffered any more
    assert session.answer_pending("flush")
    transcriber.gate.set()
    await session.close("test")
    finals = finals_of(events)
    assert [(f.text, f.answers) for f in finals] == [("", ("flush",))]
    assert not session.answer_pending("flush")  # no final pending now: nothing to answer


async def test_finals_after_the_client_left_are_marked_background() -> None:
    """Finals of a client that has left run at upload priority: the transcriber sees
    `client_gone` for the final of the utterance that was open at the disconnect."""
    events: list[StreamEvent] = []
    gone_at_call: list[bool] = []

    class Watching(Transcriber):
        async def __call__(self, audio: Any, language: str | None, partial: bool = False) -> str:
            if not partial:
                gone_at_call.append(session.client_gone)
            return await super().__call__(audio, language, partial)

    session = session_with(Watching(), events, use_vad=False)
    await session.feed(load("sentence_02.wav"))
    await session.close("disconnect")
    assert gone_at_call == [True]
    other = session_with(Watching(), events, use_vad=False)
    session = other
    await other.feed(load("sentence_02.wav"))
    await other.close("shutdown")  # the client is still there: its final is real-time
    assert gone_at_call == [True, False]


async def test_a_client_faster_than_its_finals_has_one_final_in_flight() -> None:
    """Early finals start only at the live edge: a client that sends many utterances faster
    than real time gets its finals one at a time, in order (they were all queued at once,
    at real-time priority, and stayed so after the client left)."""
    events: list[StreamEvent] = []
    transcriber = Transcriber(delay=0.3)
    session = session_with(transcriber, events)
    gap = np.zeros(16000, np.float32)
    audio = np.concatenate([load("sentence_01.wav"), gap, load("sentence_02.wav"), gap] * 2)
    await session.feed(audio)  # all at once
    await session.close("test")
    finals = finals_of(events)
    assert len(finals) == 4
    assert transcriber.max_in_flight == 1


async def test_a_session_held_back_shows_its_lag_until_it_catches_up() -> None:
    """Finals held by the engine: past max_pending_s the next message waits for room, so the
    session falls behind real time. Its lag (and the registry's largest lag and pending
    finals, which /metrics shows) says so, and returns to 0 once it catches up."""
    gate = asyncio.Event()

    class Held(Transcriber):
        async def __call__(self, audio: Any, language: str | None, partial: bool = False) -> str:
            await gate.wait()
            return await super().__call__(audio, language, partial)

    lags: list[float] = []
    events: list[StreamEvent] = []

    async def emit(event: StreamEvent) -> None:
        events.append(event)

    config = StreamConfig(use_vad=False, max_pending_s=1.0, flush_silence_ms=0)
    session = StreamSession(config, Held(), emit, SileroModel(), observe_lag=lags.append)
    registry = SessionRegistry(4)
    registry.add(session)
    audio = load("sentence_01.wav")[: FRAME * 62]
    held = len(audio) / 16000  # ~2 s
    await session.feed(audio)
    await session.flush()  # 2 s wait for their final: past max_pending_s
    assert registry.lag() == (0.0, held)
    behind = asyncio.create_task(session.feed(audio[:1600]))
    while session.lag == 0:  # the message is waiting for room
        await asyncio.sleep(0.01)
    lag, pending = registry.lag()
    assert lag > 0 and pending == held and not behind.done()
    gate.set()
    await asyncio.wait_for(behind, 30)
    assert session.lag == 0 and registry.lag()[0] == 0
    assert len(lags) == 2 and lags[-1] >= lag  # each message's lag was observed
    await session.close("test")
    assert registry.lag() == (0.0, 0.0)


async def test_a_gone_clients_finals_are_joined_with_one_copy_per_group(monkeypatch: Any) -> None:
    """Review of issue 49 item 5: `Finals.merge` joined the queued finals one by one, copying
    the group's audio again for every final it took (quadratic, on the event loop). Each
    group's audio is copied once; nothing is lost or reordered."""
    gate = asyncio.Event()

    async def text(audio: np.ndarray) -> Heard:
        await gate.wait()
        return Heard("")

    async def emit(event: StreamEvent) -> None:
        pass

    finals = Finals(text, emit, lambda: 1e12)
    second = 16000
    items = [
        PendingFinal(Utterance(i, second, 0), np.full(second, i, np.float32), "flush", None, 0, 1)
        for i in range(86)
    ]
    for item in items:
        await finals.put(item)
    while finals._running is None:  # the first final is at the gate, the rest are queued
        await asyncio.sleep(0.001)
    copied: list[int] = []
    concatenate = np.concatenate

    def counting(arrays: Any, *args: Any, **kwargs: Any) -> np.ndarray:
        joined: np.ndarray = concatenate(arrays, *args, **kwargs)
        copied.append(len(joined))
        return joined

    monkeypatch.setattr(np, "concatenate", counting)
    finals.merge(25 * second, "disconnect")
    monkeypatch.undo()
    queued = list(finals._items)
    assert [len(item.audio) // second for item in queued] == [25, 25, 25, 10]
    assert copied == [25 * second] * 3 + [10 * second]  # once per group, not per final
    joined = np.concatenate([item.audio for item in queued])
    assert np.array_equal(joined, np.concatenate([item.audio for item in items[1:]]))
    assert sum(item.seconds for item in queued) == 85
    gate.set()
    await finals.close()


async def test_a_shutdown_with_no_time_counts_the_open_utterances_not_transcribed() -> None:
    """Review of issue 49 item 5: with SHUTDOWN_TIMEOUT=0 (or when the time was up before a
    close had committed the open utterance, a stereo close waiting for its turn) the open
    utterance was neither transcribed nor counted in the "not transcribed" log. A timeout of
    0 stops every session at once, and the log counts each channel's open utterance."""
    lines: list[str] = []
    handler = logger.add(lambda m: lines.append(str(m)), level="WARNING")
    transcriber = Transcriber()
    events: list[StreamEvent] = []
    config = StreamConfig(use_vad=False)
    channels = [session_with(transcriber, events, use_vad=False) for _ in range(2)]
    group = ChannelGroup(channels)
    mono = StreamSession(config, transcriber, lambda e: asyncio.sleep(0), SileroModel())
    registry = SessionRegistry(4)
    registry.add(group)
    registry.add(mono)
    speech = load("sentence_02.wav")[:16000]  # 1 s
    try:
        await group.feed(np.stack([speech, speech], axis=1))
        await mono.feed(speech[: 16000 // 2])
        await registry.close_all(0)
    finally:
        logger.remove(handler)
    counted = [re.search(r"(\d+) finals \(([\d.]+) s of audio\)", line) for line in lines]
    found = sorted((int(m[1]), float(m[2])) for m in counted if m)
    assert found == [(1, 0.5), (2, 2.0)], lines  # (the echo gate holds < 20 ms per channel)
    assert not finals_of(events)  # no time: no final
