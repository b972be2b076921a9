"""Who is speaking, online: one stream's speakers as voice centroids (issue 51).

Pure arithmetic on voice fingerprints (unit vectors from the diarizer child); no audio, no
asyncio. An utterance comes as the fingerprints of its consecutive windows
(`windows()`); `Speakers.label` says where its speaker changes, if anywhere, and who speaks
each part: a known speaker's name, or a letter (A, B, ... in order of first appearance,
stable for the stream). Each labelled part moves its speaker's centroid.

Thresholds were tuned on the repo's voices (tests/data/speech: meeting.wav's three speakers
and their reference clips; docs/BENCHMARKS.md): whole utterances of one speaker meet at
cosine >= 0.77, of two speakers at <= 0.63; 1.5 s windows spread wider (0.54 / 0.73).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from ..audio.pcm import SAMPLE_RATE
from ..text import letter

WINDOW_S = 1.5  # an utterance is cut into equal windows of 1.5-3 s, each fingerprinted
MIN_VOICE_S = 0.3  # shorter: no fingerprint (the final keeps the previous speaker)
NEW_SPEAKER_S = 1.0  # a new speaker needs this much speech; shorter goes to the nearest
SAME_SPEAKER = 0.75  # cosine to a centroid at or above which it is that speaker
SPLIT_BELOW = 0.7  # two parts this far apart, each another speaker's: the speaker changed
SPLIT_ALONE = 0.45  # two parts this far apart are two speakers even with no centroid yet
MIN_PART = 2  # windows on each side of a change (3 s at least)


def windows(samples: int) -> list[tuple[int, int]]:
    """Where an utterance of this many samples is cut for fingerprints: equal consecutive
    windows of 1.5-3 s ([start, end) sample pairs); one window for a short utterance, none
    under MIN_VOICE_S."""
    if samples < MIN_VOICE_S * SAMPLE_RATE:
        return []
    count = max(1, int(samples // (WINDOW_S * SAMPLE_RATE)))
    bounds = [round(i * samples / count) for i in range(count + 1)]
    return list(itertools.pairwise(bounds))


def unit(vector: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm else vector


@dataclass
class Voice:
    name: str
    total: np.ndarray  # the sum of its parts' fingerprints, each weighted by seconds
    known: bool = False

    @property
    def centroid(self) -> np.ndarray:
        return unit(self.total)


@dataclass(frozen=True)
class Part:
    """A stretch of one utterance (samples from its start) and who speaks it."""

    start: int
    end: int
    speaker: str


@dataclass
class Speakers:
    """One stream's speakers (one channel's, on a multichannel stream)."""

    voices: list[Voice] = field(default_factory=list)
    last: str | None = None  # who spoke last

    def know(self, name: str, fingerprint: np.ndarray, seconds: float) -> None:
        """A known speaker, from the fingerprint of a reference clip of `seconds`."""
        vector = unit(np.asarray(fingerprint, np.float32)) * np.float32(seconds)
        self.voices.append(Voice(name, vector, known=True))

    def label(
        self, bounds: list[tuple[int, int]], fingerprints: np.ndarray, samples: int
    ) -> list[Part]:
        """The parts of an utterance of `samples` whose windows (`bounds`) have these
        fingerprints: one part, or one per speaker turn where the speaker changes inside it
        (at window bounds; `speakers.SpeakerLabels` places each change more finely). No
        windows (too short): one part, the last speaker's (none yet: an empty list)."""
        if not bounds:
            return [Part(0, samples, self.last)] if self.last is not None else []
        weights = np.array([(b - a) / SAMPLE_RATE for a, b in bounds], dtype=np.float32)
        vectors = np.asarray(fingerprints, dtype=np.float32) * weights[:, None]
        edges = [0, *self._changes(vectors, 0, len(vectors)), len(vectors)]
        parts: list[Part] = []
        for first, last in itertools.pairwise(edges):
            who = self._assign(vectors[first:last].sum(0), float(weights[first:last].sum()))
            start = 0 if first == 0 else bounds[first][0]
            if parts and parts[-1].speaker == who:  # (the part matched its neighbour)
                parts[-1] = Part(parts[-1].start, samples, who)
            else:
                parts.append(Part(start, samples, who))
            if len(parts) > 1:
                parts[-2] = Part(parts[-2].start, parts[-1].start, parts[-2].speaker)
        return parts

    def centroid(self, name: str) -> np.ndarray | None:
        voice = next((v for v in self.voices if v.name == name), None)
        return None if voice is None else voice.centroid

    def _changes(self, vectors: np.ndarray, lo: int, hi: int) -> list[int]:
        """The windows in [lo, hi) where another speaker starts: the cut whose two sides are
        furthest apart, when they are far enough apart and belong to different speakers (or
        are very far apart), then the same within each side."""
        if hi - lo < 2 * MIN_PART:
            return []
        best, cut = 2.0, lo
        for k in range(lo + MIN_PART, hi - MIN_PART + 1):
            score = float(unit(vectors[lo:k].sum(0)) @ unit(vectors[k:hi].sum(0)))
            if score < best:
                best, cut = score, k
        if best >= SPLIT_BELOW:
            return []
        if best >= SPLIT_ALONE:
            left, right = vectors[lo:cut].sum(0), vectors[cut:hi].sum(0)
            if self._nearest(left) == self._nearest(right):
                return []
        return [*self._changes(vectors, lo, cut), cut, *self._changes(vectors, cut, hi)]

    def _nearest(self, vector: np.ndarray) -> int | None:
        """The voice at or above SAME_SPEAKER (the closest), else None."""
        if not self.voices:
            return None
        scores = [float(unit(vector) @ v.centroid) for v in self.voices]
        best = int(np.argmax(scores))
        return best if scores[best] >= SAME_SPEAKER else None

    def _assign(self, vector: np.ndarray, seconds: float) -> str:
        """The speaker of a part (its weighted fingerprint sum), whose centroid it moves; a
        new letter when no voice is close and the part is long enough to be sure."""
        index = self._nearest(vector)
        if index is None and self.voices and seconds < NEW_SPEAKER_S:
            scores = [float(unit(vector) @ v.centroid) for v in self.voices]
            index = int(np.argmax(scores))
        if index is None:
            unknown = sum(1 for v in self.voices if not v.known)
            self.voices.append(Voice(letter(unknown), np.zeros_like(vector)))
            index = len(self.voices) - 1
        voice = self.voices[index]
        voice.total = voice.total + vector
        self.last = voice.name
        return voice.name
