"""The online clustering of live speakers (`streaming/voices.py`), on made-up fingerprints:
pure arithmetic, so each rule is seen alone. Real voices go through it in
tests/test_live_speakers.py."""

from __future__ import annotations

import itertools

import numpy as np

from qwen3_asr_server.streaming.voices import MERGE_AT, SAME_SPEAKER, SPLIT_ALONE, Speakers, windows

RATE = 16000
rng = np.random.default_rng(7)
A, B, C = (v / np.linalg.norm(v) for v in rng.normal(size=(3, 192)))


def near(voice: np.ndarray, noise: float = 0.3) -> np.ndarray:
    """A window of this voice: the voice plus a little noise, unit length."""
    v = voice + noise * rng.normal(size=192) / np.sqrt(192)
    return v / np.linalg.norm(v)


def utterance(*voices: np.ndarray) -> tuple[list[tuple[int, int]], np.ndarray, int]:
    """One 1.5 s window per voice given, in order."""
    bounds = windows(int(len(voices) * 1.5 * RATE))
    assert len(bounds) == len(voices)
    return bounds, np.stack([near(v) for v in voices]), bounds[-1][1]


def speakers_of(speakers: Speakers, *voices: np.ndarray) -> list[str]:
    return [p.speaker for p in speakers.label(*utterance(*voices))]


def test_speakers_are_lettered_in_order_of_appearance_and_stay_stable() -> None:
    s = Speakers()
    said = [speakers_of(s, v, v) for v in (A, B, A, C, B, C)]
    assert said == [["A"], ["B"], ["A"], ["C"], ["B"], ["C"]]


def test_changes_inside_one_utterance_give_one_part_per_turn() -> None:
    s = Speakers()
    speakers_of(s, A, A)
    speakers_of(s, B, B)
    bounds, vectors, samples = utterance(A, A, B, B, A, A)
    parts = s.label(bounds, vectors, samples)
    assert [p.speaker for p in parts] == ["A", "B", "A"]
    assert [p.start for p in parts] == [0, bounds[2][0], bounds[4][0]]
    assert parts[-1].end == samples and all(a.end == b.start for a, b in itertools.pairwise(parts))


def test_a_voice_turn_shorter_than_two_windows_is_not_split_off() -> None:
    s = Speakers()
    speakers_of(s, A, A)
    speakers_of(s, B, B)
    assert speakers_of(s, A, A, B) == ["A"]  # (one window of B: too little to be sure)


def test_two_far_apart_voices_split_even_before_either_is_known() -> None:
    assert speakers_of(Speakers(), A, A, B, B) == ["A", "B"]


def test_a_short_utterance_goes_to_the_nearest_speaker_and_never_makes_a_new_one() -> None:
    s = Speakers()
    speakers_of(s, A, A)
    speakers_of(s, B, B)
    short = windows(int(0.8 * RATE))
    assert len(short) == 1
    parts = s.label(short, np.stack([near(C)]), short[0][1])  # C is far from both
    assert [p.speaker for p in parts] == [s.last] and s.last in ("A", "B")
    assert len(s.voices) == 2


def test_too_short_to_fingerprint_keeps_the_last_speaker() -> None:
    s = Speakers()
    assert windows(int(0.2 * RATE)) == []
    assert s.label([], np.zeros((0, 192)), 3200) == []  # nobody spoke yet
    speakers_of(s, B, B)
    assert [p.speaker for p in s.label([], np.zeros((0, 192)), 3200)] == ["A"]


def test_known_speakers_are_named_and_others_lettered() -> None:
    s = Speakers()
    s.know("Maria", A, 5.0)
    assert speakers_of(s, C, C) == ["A"]
    assert speakers_of(s, A, A) == ["Maria"]


def between(a: np.ndarray, b: np.ndarray, weight: float) -> np.ndarray:
    """A voice `weight` of the way from a's direction to b's, unit length."""
    v = a + weight * b
    return v / np.linalg.norm(v)


def test_a_voice_below_the_threshold_is_a_new_speaker() -> None:
    s = Speakers()
    speakers_of(s, A, A)
    other = between(A, C, 1.5)  # cosine 0.55 to A: below SAME_SPEAKER and MERGE_AT
    assert float(other @ A) < min(SAME_SPEAKER, MERGE_AT)
    assert speakers_of(s, other, other) == ["B"]


def test_a_voice_whose_windows_meet_a_speaker_s_is_that_speaker() -> None:
    """Just below SAME_SPEAKER to A's centroid (a noisy first guess would give it a new
    letter), but its windows meet A's at MERGE_AT or more on average: it is A, and no new
    letter is used up (issue 58 §1: one caller split into two)."""
    s = Speakers()
    speakers_of(s, A, A)
    close = between(A, C, 1.0)  # cosine 0.7 to A
    assert MERGE_AT < float(close @ A) < SAME_SPEAKER
    assert speakers_of(s, close, close) == ["A"]
    assert speakers_of(s, B, B) == ["B"] and len(s.voices) == 2


def test_two_letters_that_turn_out_one_voice_merge_and_the_longer_keeps_its_name() -> None:
    s = Speakers()
    for _ in range(3):
        speakers_of(s, A, A)  # A: 9 s of speech
    s.voices[0].total = s.voices[0].total * 0  # (a made-up second centroid for one voice:
    s.voices[0].seconds = 0.0  # its speech not counted, so it merges with nothing)
    speakers_of(s, A, A)
    assert [v.name for v in s.voices] == ["A", "B"]
    s.voices[0].total, s.voices[0].seconds = np.asarray(near(A)) * 9.0, 9.0
    assert speakers_of(s, A, A) == ["A"]  # merged: B (3 s) is A's from now on
    assert [v.name for v in s.voices] == ["A"] and s.aliases == {"B": "A"}
    assert s.centroid("B") is not None and speakers_of(s, C, C) == ["C"]


def test_a_change_in_the_first_utterance_is_split_though_no_voice_is_known_yet() -> None:
    """Issue 58 §2.4: two voices fairly far apart (between SPLIT_ALONE and SPLIT_BELOW)
    joined with no pause in a stream's first utterance: one part each, not one mixed
    voice."""
    other = between(A, C, 1.5)
    assert SPLIT_ALONE < float(other @ A) < MERGE_AT
    s = Speakers()
    assert speakers_of(s, A, A, other, other) == ["A", "B"]
    assert speakers_of(s, other, other) == ["B"] and speakers_of(s, A, A) == ["A"]


def test_a_known_speaker_heard_before_its_fingerprint_came_is_one_voice() -> None:
    """Issue 58 §2.2: a final labelled before the known speakers' fingerprints came got a
    letter; when they come, that letter's voice joins the known speaker, so its voice has
    one centroid and every later final gets the name."""
    s = Speakers()
    assert speakers_of(s, A, A) == ["A"]
    s.know("Maria", near(A, 0.5), 5.0)
    assert [v.name for v in s.voices] == ["Maria"] and s.last == "Maria"
    assert all(speakers_of(s, A, A) == ["Maria"] for _ in range(5))
    assert speakers_of(s, B, B) == ["B"]
