"""Word timestamps that keep the transcript's own words.

Qwen3-ForcedAligner times *its* tokens, built from the transcript's letters, digits and
apostrophes only ("$3.50" -> "350", "state-of-the-art" -> "stateoftheart", CJK punctuation
dropped). Here each aligner item is mapped back onto the span of the transcript it came from,
so the words carry the transcript's punctuation, symbols and hyphens, and joined they give
the transcript back. No heavy imports.
"""

from __future__ import annotations

import itertools
import unicodedata
from collections.abc import Sequence
from typing import Protocol

from ...transcript import Word


class AlignedItem(Protocol):
    text: str
    start_time: float
    end_time: float


def kept(char: str) -> bool:
    """The characters the aligner keeps (the SDK's rule): letters, digits, apostrophes."""
    return char == "'" or unicodedata.category(char)[0] in "LN"


def words_from_items(text: str, items: Sequence[AlignedItem], duration: float) -> list[Word] | None:
    """One word per aligner item, holding its span of `text`.

    Text between two items goes to the earlier one up to the last whitespace (trailing
    punctuation: "Hello," "world.") and to the later one after it (leading symbols: "$3.50").
    Returns None when the items do not spell the transcript's kept characters in order
    (an aligner whose tokenizer differs): the caller then falls back to spread times.
    """
    positions = [i for i, char in enumerate(text) if kept(char)]
    starts: list[int] = []  # index into `text` of each item's first character
    cursor = 0
    for item in items:
        letters = [c for c in item.text if kept(c)]
        if not letters or cursor + len(letters) > len(positions):
            return None
        if any(text[positions[cursor + k]] != c for k, c in enumerate(letters)):
            return None
        starts.append(positions[cursor])
        cursor += len(letters)
    if cursor != len(positions) or not starts:
        return None
    bounds = [0]
    for prev, nxt in itertools.pairwise(starts):
        gap = text[prev:nxt]
        last_space = max((i for i, c in enumerate(gap) if c.isspace()), default=-1)
        bounds.append(prev + last_space + 1 if last_space >= 0 else nxt)
    bounds.append(len(text))
    words: list[Word] = []
    last = 0.0
    for k, item in enumerate(items):
        piece = text[bounds[k] : bounds[k + 1]].strip()
        start = min(max(float(item.start_time), last), duration)  # forward, inside the audio
        end = min(max(float(item.end_time), start), duration)
        words.append(Word(word=piece, start=start, end=end))
        last = start
    return words
