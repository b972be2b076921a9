"""Subtitle cue rules on synthetic timed words (Latin and CJK)."""

from __future__ import annotations

import itertools

from qwen3_asr_server.outputs.subtitles import CueRules, build_cues, display_width, wrap
from qwen3_asr_server.transcript import Segment, Word


def timed(text: str, start: float = 0.0, step: float = 0.4, gaps: dict[int, float] | None = None):
    words, t = [], start
    for i, w in enumerate(text.split()):
        t += (gaps or {}).get(i, 0.0)
        words.append(Word(w, t, t + step * 0.9))
        t += step
    return words


def check_rules(cues, rules: CueRules) -> None:
    for cue in cues:
        assert 1 <= len(cue.lines) <= rules.max_lines
        assert all(display_width(line) <= rules.max_line_chars for line in cue.lines)
        assert cue.end - cue.start <= rules.max_seconds + 1e-6
        assert cue.end > cue.start
    for a, b in itertools.pairwise(cues):
        assert a.end <= b.start + 1e-9


def test_sentence_ends_and_pauses_start_new_cues() -> None:
    words = timed("Hello there friend. How are you today? Fine", gaps={7: 1.0})
    cues = build_cues([Segment(0, 10, "", words=words)], CueRules())
    assert [c.text for c in cues] == ["Hello there friend.", "How are you today?", "Fine"]
    check_rules(cues, CueRules())


def test_long_text_is_wrapped_into_two_balanced_lines_and_split_into_cues() -> None:
    text = " ".join(["word"] * 60)
    rules = CueRules(max_line_chars=20)
    cues = build_cues([Segment(0, 30, "", words=timed(text, step=0.2))], rules)
    check_rules(cues, rules)
    assert len(cues) > 3
    assert any(len(c.lines) == 2 for c in cues)
    assert " ".join(" ".join(c.lines) for c in cues) == text  # nothing lost or repeated


def test_max_duration_splits_slow_speech() -> None:
    rules = CueRules(max_seconds=3.0)
    cues = build_cues([Segment(0, 20, "", words=timed("a b c d e f g h i j", step=1.0))], rules)
    check_rules(cues, rules)
    assert len(cues) >= 4


def test_short_cues_are_stretched_to_the_minimum_without_overlap() -> None:
    words = [Word("Yes.", 0.0, 0.2), Word("No.", 0.5, 0.7), Word("Maybe", 3.0, 3.2)]
    rules = CueRules(min_seconds=1.0)
    cues = build_cues([Segment(0, 4, "", words=words)], rules)
    check_rules(cues, rules)
    assert cues[-1].end - cues[-1].start >= 1.0


def test_cues_of_two_speakers_may_overlap() -> None:
    """Issue 49: an interjection during another speaker's cue keeps its own times, and the
    cue it interrupts keeps its end; only one speaker's cues are kept apart."""
    rules = CueRules(min_seconds=0.833)
    words = timed("we ship the release at the end of", start=0.5, step=0.8)
    agent = Segment(0.5, 7.0, "", words=words, speaker="agent")
    customer = Segment(2.6, 4.0, "", words=[Word("Really?", 2.6, 4.0)], speaker="customer")
    cues = build_cues([agent, customer], rules)
    interjection = next(c for c in cues if c.speaker == "customer")
    assert (interjection.start, interjection.end) == (2.6, 4.0)
    assert [c.start for c in cues] == sorted(c.start for c in cues)
    own = [c for c in cues if c.speaker == "agent"]
    assert own[0].end == words[-1].end  # not cut short at the interjection (was 2.517)
    assert all(a.end <= b.start for a, b in itertools.pairwise(own))


def test_no_cue_is_stretched_past_the_end_of_the_audio() -> None:
    """issue 41: a short last cue was stretched to the minimum duration past the end (a
    0.6 s clip's cue ended at 0.833)."""
    rules = CueRules(min_seconds=0.833)
    cues = build_cues([Segment(0, 0.6, "", words=[Word("Hi.", 0.1, 0.4)])], rules, 0.6)
    assert (cues[0].start, cues[0].end) == (0.1, 0.6)
    words = [Word("One.", 0.0, 0.3), Word("Two.", 13.2, 13.4)]
    cues = build_cues([Segment(0, 13.456, "", words=words)], rules, 13.456)
    assert cues[0].end - cues[0].start >= 0.833 and cues[-1].end == 13.456
    # words that end past the stated length keep their own end (never shortened)
    cues = build_cues([Segment(0, 1, "", words=[Word("Late", 0.5, 1.2)])], rules, 1.0)
    assert cues[0].end == 1.2


def test_cjk_is_split_per_character_and_measured_in_display_width() -> None:
    text = "今天天气很好我们去公园散步吧然后去吃饭晚上看电影"
    rules = CueRules(max_line_chars=10)  # 5 wide characters per line
    segment = Segment(0.0, 12.0, text)  # no words: spread per character
    cues = build_cues([segment], rules)
    check_rules(cues, rules)
    assert all(" " not in line for c in cues for line in c.lines)
    assert "".join("".join(c.lines) for c in cues) == text
    assert max(display_width(line) for c in cues for line in c.lines) == 10


def test_mixed_cjk_and_latin_spacing() -> None:
    assert wrap(["我", "爱", "Python", "和", "你"], 42, 2) == ["我爱 Python 和你"]


def test_a_single_word_longer_than_a_line_still_gets_a_cue() -> None:
    words = [Word("https://example.com/a/very/long/path/that/does/not/fit/anywhere", 0, 1)]
    cues = build_cues([Segment(0, 1, "", words=words)], CueRules(max_line_chars=20))
    assert len(cues) == 1 and cues[0].lines[0].startswith("https://")
