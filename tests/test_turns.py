"""TurnDetector on its own: frames and speech flags in, turn events out (no VAD model, no
inference, no event loop)."""

from __future__ import annotations

import numpy as np

from qwen3_asr_server.audio.vad import FRAME
from qwen3_asr_server.streaming.session import StreamConfig
from qwen3_asr_server.streaming.turns import (
    EarlyFinalPoint,
    MaxLengthCut,
    PartialDue,
    SpeechResumed,
    TurnDetector,
    TurnEnded,
    TurnEvent,
    TurnStarted,
)


def frame(value: float = 0.1) -> np.ndarray:
    return np.full(FRAME, value, dtype=np.float32)


def steps(turns: TurnDetector, flags: list[bool]) -> list[list[TurnEvent]]:
    return [turns.step(frame(0.1 if speech else 0.0), speech) for speech in flags]


def test_a_turn_starts_with_its_prefix_padding() -> None:
    turns = TurnDetector(StreamConfig(prefix_padding_ms=300))
    assert steps(turns, [False] * 20) == [[]] * 20  # silence: nothing, and no utterance
    assert turns.utterance is None
    [[started]] = steps(turns, [True])
    assert isinstance(started, TurnStarted) and started.utt is turns.utterance
    keep = 300 * 16 // FRAME  # whole frames of pre-roll
    assert started.utt.length == (keep + 1) * FRAME
    assert started.utt.start_sample == (20 - keep) * FRAME
    assert started.utt.id == 1


def test_silence_gives_the_early_final_point_then_ends_the_turn() -> None:
    turns = TurnDetector(StreamConfig(end_silence_ms=500))
    steps(turns, [True] * 10)
    end = -(-500 * 16 // FRAME)  # frames of silence that end the turn
    events = steps(turns, [False] * end)
    early = [i for i, e in enumerate(events) if any(isinstance(x, EarlyFinalPoint) for x in e)]
    assert early == list(range(1, end - 1))  # from the second silent frame, until the end
    ended = [i for i, e in enumerate(events) if any(isinstance(x, TurnEnded) for x in e)]
    assert ended == [end - 1]
    [stop] = events[end - 1]
    assert isinstance(stop, TurnEnded) and stop.at_ms == (10 + end) * FRAME * 1000 // 16000
    utt, padded = turns.take()
    assert utt is stop.utt and padded == 0 and turns.utterance is None
    assert utt.length == (10 + end) * FRAME


def test_speech_after_silence_is_resumed_speech() -> None:
    turns = TurnDetector(StreamConfig())
    steps(turns, [True] * 5)
    assert not any(isinstance(x, SpeechResumed) for e in steps(turns, [True] * 3) for x in e)
    events = steps(turns, [False, False, False, True])
    assert isinstance(events[-1][0], SpeechResumed) and turns.silence == 0


def test_without_vad_silence_never_ends_the_turn() -> None:
    turns = TurnDetector(StreamConfig(use_vad=False, max_utterance_s=60))
    steps(turns, [True])
    events = [x for e in steps(turns, [False] * 100) for x in e]
    assert not any(isinstance(x, EarlyFinalPoint | TurnEnded) for x in events)


def test_max_length_cuts_without_losing_audio() -> None:
    turns = TurnDetector(StreamConfig(use_vad=False, max_utterance_s=2.0))
    rng = np.random.default_rng(1)
    audio = (rng.standard_normal(FRAME * 80) * 0.1).astype(np.float32)
    audio[FRAME * 50 : FRAME * 52] = 0.0  # a quiet stretch to cut at
    cuts: list[MaxLengthCut] = []
    for i in range(0, len(audio), FRAME):
        cuts += [x for x in turns.step(audio[i : i + FRAME], True) if isinstance(x, MaxLengthCut)]
    [cut] = cuts
    head, rest = cut.head, turns.utterance
    assert rest is not None and (head.id, rest.id) == (1, 2)
    assert FRAME * 49 <= head.length <= FRAME * 53  # at the quiet stretch
    assert rest.start_sample == head.start_sample + head.length
    joined = np.concatenate([head.audio, rest.audio])
    assert np.array_equal(joined, audio[: len(joined)])
    assert len(joined) == len(audio)


def test_partials_are_due_after_0_3_s_then_every_interval() -> None:
    turns = TurnDetector(StreamConfig(partial_interval_s=0.45))
    due: list[int] = []
    for n in range(60):
        events = turns.step(frame(), True)
        if any(isinstance(x, PartialDue) for x in events):
            due.append(n)
            turns.partial_started()
    first = -(-(0.3 * 16000 - FRAME) // FRAME)  # the starting frame counts
    interval = -(-(0.45 * 16000) // FRAME)
    assert due[:3] == [first, first + interval, first + 2 * interval]


def test_a_partial_stays_due_until_one_starts() -> None:
    turns = TurnDetector(StreamConfig())
    events = [x for e in steps(turns, [True] * 30) for x in e]
    assert sum(isinstance(x, PartialDue) for x in events) > 1  # the session was busy


def test_a_flush_pads_the_last_part_frame_and_counts_it_as_padding() -> None:
    turns = TurnDetector(StreamConfig())
    whole = turns.frames(np.full(FRAME * 3 + 100, 0.1, dtype=np.float32))
    assert len(whole) == FRAME * 3
    for i in range(0, len(whole), FRAME):
        turns.step(whole[i : i + FRAME], True)
    turns.pad_leftover()
    utt, padded = turns.take()
    assert utt is not None and utt.length == FRAME * 4 and padded == FRAME - 100
    # the stream's clock counts the client's samples, not the padding: after many flushes
    # the finals' times (and Realtime's audio_*_ms) would otherwise run past the audio
    assert turns.pos == FRAME * 3 + 100


def test_idle_timeout_after_that_much_silence_without_an_utterance() -> None:
    """Server VAD with idle_timeout_ms: an IdleTimeout (a new item number, the silent span)
    after that long with no speech, counted from the end of the last speech; none without
    VAD or without a timeout."""
    from qwen3_asr_server.streaming.turns import IdleTimeout

    turns = TurnDetector(StreamConfig(idle_timeout_ms=1000, end_silence_ms=500))
    per_second = -(-16000 // FRAME)
    flat = [e for step in steps(turns, [False] * per_second) for e in step]
    assert len(flat) == 1 and isinstance(flat[0], IdleTimeout)
    assert (flat[0].utterance, flat[0].start_ms) == (1, 0)
    assert flat[0].end_ms == per_second * FRAME * 1000 // 16000
    steps(turns, [True] * 10)  # speech: utterance 2, ended by 500 ms of silence
    silent = 0
    while not any(isinstance(e, TurnEnded) for e in turns.step(frame(0.0), False)):
        silent += 1
    turns.take()  # as the session does at once
    spoken_end = turns.pos - (silent + 1) * FRAME
    # the idle span starts at the last speech, so it ends 1 s after it, not after the commit
    events = [e for step in steps(turns, [False] * per_second) for e in step]
    [idle] = [e for e in events if isinstance(e, IdleTimeout)]
    assert idle.utterance == 3 and idle.start_ms == spoken_end * 1000 // 16000
    assert 1000 <= idle.end_ms - idle.start_ms <= 1000 + FRAME * 1000 // 16000
    for config in (StreamConfig(), StreamConfig(use_vad=False, idle_timeout_ms=1000)):
        quiet = TurnDetector(config)
        assert not any(steps(quiet, [False] * per_second * 3))
