"""A transcript cut at speaker turns: each word goes to the speaker whose turn it overlaps
most (the nearest turn when it overlaps none), and consecutive words of one speaker make one
segment, so no word is ever in two segments. Speakers are named `A`, `B`, ... in order of
first speech, or by a known speaker's name when its voice matches (cosine similarity).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

import numpy as np

from ..engines.speakers.diarize import Diarization, Turn
from ..text import join_texts, letter
from ..transcript import Segment, Transcript, Word

# Cosine similarity of CAM++ voice fingerprints: 0.80-0.96 for the same speaker, at most 0.62
# for the next best on our measurements (FACTS.md); a cluster below this keeps a letter.
MATCH_THRESHOLD = 0.7


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(np.dot(a, b) / norm) if norm else 0.0


def speaker_names(
    diarization: Diarization,
    known: list[tuple[str, np.ndarray]],
    threshold: float = MATCH_THRESHOLD,
) -> dict[int, str]:
    """Known names to the clusters they match best (each name once, best pairs first, above
    the threshold); every other speaker a letter, in order of first speech."""
    pairs = sorted(
        (
            (cosine(vector, voice), speaker, name)
            for speaker, vector in diarization.centroids.items()
            for name, voice in known
        ),
        reverse=True,
    )
    names: dict[int, str] = {}
    for score, speaker, name in pairs:
        if score >= threshold and speaker not in names and name not in names.values():
            names[speaker] = name
    speakers = sorted({t.speaker for t in diarization.turns})
    unknown = [s for s in speakers if s not in names]
    for i, speaker in enumerate(unknown):
        names[speaker] = letter(i)
    return names


def speaker_of(word: Word, turns: list[Turn]) -> int:
    best, best_overlap = turns[0].speaker, -1.0
    middle = (word.start + word.end) / 2
    for turn in turns:
        overlap = min(word.end, turn.end) - max(word.start, turn.start)
        if overlap <= 0:  # no overlap: closeness counts, as a negative overlap
            overlap = -min(abs(middle - turn.start), abs(middle - turn.end)) - 1.0
        if overlap > best_overlap:
            best, best_overlap = turn.speaker, overlap
    return best


def by_speaker(
    result: Transcript,
    diarization: Diarization,
    names: dict[int, str],
    known: Collection[str] = (),
) -> Transcript:
    """The transcript with one segment per speaker turn (its words kept, in order). The
    speakers not `known` are lettered again in order of their first word, so a cluster that
    got no word (a cough, a breath) leaves no gap (A, C)."""
    words = [w for s in result.segments for w in s.words]
    if not words:
        return result
    turns = diarization.turns
    ids = [speaker_of(word, turns) if turns else -1 for word in words]
    letters: dict[int, str] = {}
    for sid in ids:
        label = names.get(sid)
        if sid not in letters and (label is None or label not in known):
            letters[sid] = letter(len(letters))
    segments: list[Segment] = []
    current: list[Word] = []
    speaker: str | None = None
    for word, sid in zip(words, ids, strict=True):
        who = letters.get(sid) or names[sid]
        if current and who != speaker:
            segments.append(_segment(current, speaker))
            current = []
        current.append(word)
        speaker = who
    segments.append(_segment(current, speaker))
    # the text is its segments' text: the same words, as they were cut
    return replace(result, segments=segments, text=join_texts([s.text for s in segments]))


def _segment(words: list[Word], speaker: str | None) -> Segment:
    text = join_texts([w.word for w in words])
    return Segment(words[0].start, words[-1].end, text, list(words), speaker=speaker)
