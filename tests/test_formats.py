"""SRT / VTT / verbose_json bodies, parsed with standard libraries."""

from __future__ import annotations

import io
import itertools

import srt
import webvtt

from contract import check_transcription
from qwen3_asr_server.outputs.formats import (
    compression_ratio,
    json_body,
    timestamp,
    to_srt,
    to_vtt,
    verbose_json_body,
)
from qwen3_asr_server.transcript import Segment, Transcript, Word
from qwen3_asr_server.transcription.timestamps import spread_words

SEGMENTS = [
    Segment(0.0, 2.5, "Hello there."),
    Segment(2.4, 3661.25, "Second cue, overlapping the first by 0.1 s."),
    Segment(3661.25, 3662.0, "   "),  # empty: no cue
    Segment(3662.0, 3663.0, "你好世界"),
]


def test_timestamp_format() -> None:
    assert timestamp(3661.25, ",") == "01:01:01,250"
    assert timestamp(0.0005, ".") == "00:00:00.000" or timestamp(0.0005, ".") == "00:00:00.001"
    assert timestamp(-1, ",") == "00:00:00,000"


def test_srt_parses_and_has_no_overlaps() -> None:
    subs = list(srt.parse(to_srt(SEGMENTS)))
    assert [s.index for s in subs] == [1, 2, 3]
    assert subs[0].content == "Hello there."
    assert subs[2].content == "你好世界"
    for a, b in itertools.pairwise(subs):
        assert a.end <= b.start
    assert subs[1].end.total_seconds() == 3661.25


def test_overlapping_speech_of_two_speakers_keeps_its_times() -> None:
    """Issue 49: a customer who interjects during the agent's turn (2.58-4.0 s) became
    `00:00:07,000 --> 00:00:07,001`. Cues of different speakers (channels) may overlap, as
    their speech does; one speaker's cues still never do."""
    turns = [
        Segment(0.5, 7.0, "Agent speaking.", speaker="agent", channel=0),
        Segment(2.58, 4.0, "Customer interjects.", speaker="customer", channel=1),
        Segment(6.8, 9.0, "Agent again.", speaker="agent", channel=0),
    ]
    subs = list(srt.parse(to_srt(turns)))
    times = [(s.start.total_seconds(), s.end.total_seconds(), s.content) for s in subs]
    assert times == [
        (0.5, 7.0, "[agent] Agent speaking."),
        (2.58, 4.0, "[customer] Customer interjects."),
        (7.0, 9.0, "[agent] Agent again."),
    ]
    captions = webvtt.from_buffer(io.StringIO(to_vtt(turns)))
    assert [(c.start, c.end) for c in captions][1] == ("00:00:02.580", "00:00:04.000")


def test_vtt_parses() -> None:
    captions = webvtt.from_buffer(io.StringIO(to_vtt(SEGMENTS)))
    assert [c.text for c in captions] == ["Hello there.", SEGMENTS[1].text, "你好世界"]
    assert captions[1].start == "00:00:02.500"


def test_empty_transcript_gives_valid_empty_files() -> None:
    assert list(srt.parse(to_srt([]))) == []
    assert to_vtt([]).startswith("WEBVTT")


def test_verbose_json_fields() -> None:
    segs = [Segment(0, 1, "a b", words=[Word("a", 0, 0.4), Word("b", 0.5, 1)])]
    body = verbose_json_body(Transcript("a b", "en", 1.0, segs), words=True, temperature=None)
    assert body["task"] == "transcribe" and body["language"] == "english"
    seg = body["segments"][0]
    assert set(seg) == {
        "id",
        "seek",
        "start",
        "end",
        "text",
        "tokens",
        "temperature",
        "avg_logprob",
        "compression_ratio",
        "no_speech_prob",
    }
    # The engine gave no scores: the documented stand-ins, so the SDK's type accepts it.
    assert (seg["avg_logprob"], seg["no_speech_prob"]) == (0.0, 0.0)
    assert seg["compression_ratio"] == compression_ratio("a b")
    check_transcription(body, "verbose_json")
    assert body["words"] == [
        {"word": "a", "start": 0, "end": 0.4},
        {"word": "b", "start": 0.5, "end": 1},
    ]
    assert "words" not in verbose_json_body(Transcript("", None, 0.0), words=False, temperature=0.2)


def test_engine_scores_are_passed_through() -> None:
    seg = Segment(0, 1, "hi", avg_logprob=-0.25, no_speech_prob=0.01, compression_ratio=1.5)
    body = verbose_json_body(Transcript("hi", "en", 1.0, [seg]), words=False, temperature=0.0)
    out = body["segments"][0]
    assert (out["avg_logprob"], out["no_speech_prob"], out["compression_ratio"]) == (
        -0.25,
        0.01,
        1.5,
    )


def test_compression_ratio_is_whisper_s() -> None:
    import zlib

    text = "thank you " * 40  # a decoder loop compresses well: whisper's > 2.4 warning
    data = text.encode()
    assert compression_ratio(text) == round(len(data) / len(zlib.compress(data)), 3)
    assert compression_ratio(text) > 2.4
    assert compression_ratio("The quick brown fox.") < 2.4
    assert compression_ratio("") == 0.0


def test_language_names_json_is_the_seed_s_verbose_is_openai_s() -> None:
    result = Transcript("你好", "zh", 1.0)
    assert check_transcription(json_body(result)).language == "Chinese"  # type: ignore[attr-defined]
    verbose = verbose_json_body(result, words=False, temperature=None)
    assert check_transcription(verbose, "verbose_json").language == "chinese"


def test_unknown_language_is_a_string_in_verbose_json() -> None:
    nothing = Transcript("", None, 1.0)
    assert json_body(nothing)["language"] is None
    verbose = verbose_json_body(nothing, words=False, temperature=None)
    assert check_transcription(verbose, "verbose_json").language == "unknown"


def test_spread_words_is_proportional_monotonic_and_cjk_aware() -> None:
    words = spread_words("a bbb", 0.0, 4.0)
    assert [(w.word, w.start, w.end) for w in words] == [("a", 0.0, 1.0), ("bbb", 1.0, 4.0)]
    cjk = spread_words("你好 world", 10.0, 12.0)
    assert [w.word for w in cjk] == ["你", "好", "world"]
    assert cjk[-1].end == 12.0
    assert all(a.end <= b.start + 1e-9 for a, b in itertools.pairwise(cjk))
