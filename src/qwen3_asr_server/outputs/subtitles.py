"""Subtitle cues from timed words: sentence and pause breaks, ≤2 lines of display width,
minimum and maximum durations, no overlaps within one speaker's cues. CJK is measured in
display columns (wide characters count 2) and joined without spaces."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from ..config import Settings
from ..text import is_cjk
from ..transcript import Segment, Word
from ..transcription.timestamps import ensure_words

SENTENCE_END = tuple(".!?。！？…")
CLAUSE_END = tuple(",;:，；：、")


@dataclass(frozen=True)
class CueRules:
    max_line_chars: int = 42
    max_lines: int = 2
    min_seconds: float = 0.833  # SUBTITLE_MIN_DURATION (the seed's defaults)
    max_seconds: float = 7.0  # SUBTITLE_MAX_DURATION
    pause_seconds: float = 0.5  # SUBTITLE_PAUSE_THRESHOLD
    min_gap: float = 0.083  # SUBTITLE_MIN_GAP


@dataclass
class Cue:
    start: float
    end: float
    lines: list[str]
    speaker: str | None = None  # with diarization: a cue never spans two speakers

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def display_width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in ("W", "F") else 1 for c in text)


def join_words(words: list[str]) -> str:
    out = ""
    for word in words:
        if out and not (is_cjk(out[-1]) and is_cjk(word[0])):
            out += " "
        out += word
    return out


def wrap(words: list[str], width: int, max_lines: int) -> list[str] | None:
    """Split into ≤ max_lines lines of ≤ width columns, as balanced as possible; None if
    the words do not fit."""
    if display_width(join_words(words)) <= width:
        return [join_words(words)]
    if max_lines < 2:
        return None
    best: list[str] | None = None
    best_score = None
    for cut in range(1, len(words)):
        first = join_words(words[:cut])
        rest = wrap(words[cut:], width, max_lines - 1)
        if display_width(first) > width or rest is None:
            continue
        score = max(display_width(line) for line in [first, *rest])
        if best_score is None or score < best_score:
            best, best_score = [first, *rest], score
    return best


def build_cues(
    segments: list[Segment], rules: CueRules, duration: float | None = None
) -> list[Cue]:
    """Cues of the segments' words; none ends past `duration` (the audio's length)."""
    ensure_words(segments)
    words = [(w, s.speaker) for s in segments for w in s.words if w.word.strip()]
    groups: list[tuple[list[Word], str | None]] = []
    current: list[Word] = []
    speaker: str | None = None
    for word, who in words:
        if current and (who != speaker or _must_break(current, word, rules)):
            groups.append((current, speaker))
            current = []
        current.append(word)
        speaker = who
    if current:
        groups.append((current, speaker))
    cues = []
    for group, who in groups:
        texts = [w.word for w in group]
        lines = wrap(texts, rules.max_line_chars, rules.max_lines) or [join_words(texts)]
        cues.append(Cue(group[0].start, max(group[-1].end, group[0].start), lines, who))
    return _fix_timing(cues, rules, duration)


def _must_break(current: list[Word], word: Word, rules: CueRules) -> bool:
    last = current[-1]
    duration = word.end - current[0].start
    if word.start - last.end >= rules.pause_seconds:
        return True
    if last.word.endswith(SENTENCE_END) and last.end - current[0].start >= rules.min_seconds:
        return True
    if duration > rules.max_seconds:
        return True
    words = [w.word for w in [*current, word]]
    return wrap(words, rules.max_line_chars, rules.max_lines) is None


def _fix_timing(cues: list[Cue], rules: CueRules, duration: float | None) -> list[Cue]:
    """Each speaker's cues timed on their own (`_fix_voice`), then all in time order: cues
    of different speakers (or channels) may overlap, as their speech does."""
    voices: dict[str | None, list[Cue]] = {}
    for cue in cues:
        voices.setdefault(cue.speaker, []).append(cue)
    for own in voices.values():
        _fix_voice(own, rules, duration)
    return sorted(cues, key=lambda cue: cue.start)


def _fix_voice(cues: list[Cue], rules: CueRules, duration: float | None) -> list[Cue]:
    """Stretch short cues toward the minimum, keep `min_gap` free before the next cue,
    never overlap, never stretch past the end of the audio."""
    for i, cue in enumerate(cues):
        if i > 0:
            cue.start = max(cue.start, cues[i - 1].end)
        limit = cue.start + rules.max_seconds
        if i + 1 < len(cues):
            limit = min(limit, max(cues[i + 1].start - rules.min_gap, cue.start + 0.001))
        if duration is not None:  # a stretch stops at the end; the words' own end stays
            limit = min(limit, max(duration, cue.end))
        want = max(cue.end, cue.start + rules.min_seconds)
        cue.end = max(min(want, limit), cue.start + 0.001)
    return cues


def cue_rules(settings: Settings, max_line_chars: int) -> CueRules:
    """The subtitle settings (SUBTITLE_*) with a request's line width."""
    return CueRules(
        max_line_chars=max_line_chars,
        min_seconds=settings.subtitle_min_duration,
        max_seconds=settings.subtitle_max_duration,
        pause_seconds=settings.subtitle_pause_threshold,
        min_gap=settings.subtitle_min_gap,
    )


def cue_segments(cues: list[Cue]) -> list[Segment]:
    """Cues as segments, for the SRT/VTT writers (line breaks kept)."""
    return [Segment(start=c.start, end=c.end, text=c.text, speaker=c.speaker) for c in cues]
