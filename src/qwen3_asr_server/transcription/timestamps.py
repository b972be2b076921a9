"""Word timestamps for engines without native ones: spread a segment's time over its words."""

from __future__ import annotations

from ..text import split_words
from ..transcript import Segment, Word


def spread_words(text: str, start: float, end: float) -> list[Word]:
    """Give each word a share of [start, end] proportional to its length in characters."""
    words = split_words(text)
    if not words or end <= start:
        return []
    total = sum(len(w) for w in words)
    out, t = [], start
    for word in words:
        dur = (end - start) * len(word) / total
        out.append(Word(word=word, start=round(t, 3), end=round(min(end, t + dur), 3)))
        t += dur
    return out


def ensure_words(segments: list[Segment]) -> None:
    """Fill `words` on segments whose engine gave none."""
    for segment in segments:
        if not segment.words and segment.text:
            segment.words = spread_words(segment.text, segment.start, segment.end)
