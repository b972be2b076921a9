"""Who is speaking, online: one stream's speakers as voice centroids (issue 51).

Pure arithmetic on voice fingerprints (unit vectors from the diarizer child); no audio, no
asyncio. An utterance comes as the fingerprints of its consecutive windows
(`windows()`); `Speakers.label` says where its speaker changes, if anywhere, and who speaks
each part: a known speaker's name, or a letter (A, B, ... in order of first appearance,
stable for the stream). Each labelled part moves its speaker's centroid.

After each utterance (and each known speaker), two voices that are one person are merged
(`_merge`): the average cosine between their windows' fingerprints (each weighted by its
seconds) at or above MERGE_AT. The voice with more speech keeps its letter (a known speaker
always keeps its name); the other letter is never given again, and its name stays an alias.
So a voice split in two by an early, noisy decision is one again from the next final on.

Thresholds were tuned on the espeak voices (tests/data/speech: meeting.wav's three speakers)
and on human read speech (tests/data/human, FLEURS: 5 people; docs/BENCHMARKS.md): turns of
one speaker meet at an average window cosine of >= 0.61, of two speakers at <= 0.55; a
single 1-3 s window lies 0.60-0.95 from its own speaker's centroid and up to 0.69 from
another's, so a short utterance alone never starts a new speaker.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from ..audio.pcm import SAMPLE_RATE
from ..text import letter

WINDOW_S = 1.5  # an utterance is cut into equal windows of 1.5-3 s, each fingerprinted
MIN_VOICE_S = 0.3  # shorter: no fingerprint (the final keeps the previous speaker)
NEW_SPEAKER_S = 2.0  # a new speaker needs this much speech; shorter goes to the nearest
SAME_SPEAKER = 0.75  # cosine to a centroid at or above which it is that speaker
SPLIT_BELOW = 0.7  # two parts this far apart, each another speaker's: the speaker changed
SPLIT_ALONE = 0.45  # two parts this far apart are two speakers even with no centroid yet
MERGE_AT = 0.6  # two voices whose windows meet at this average cosine are one speaker
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
    seconds: float = 0.0  # of speech (or of the reference clip) in `total`

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
    lettered: int = 0  # letters given so far (a merged-away letter is never given again)
    aliases: dict[str, str] = field(default_factory=dict)  # merged-away letter -> its voice
    said: set[str] = field(default_factory=set)  # the names `label` has returned

    def know(self, name: str, fingerprint: np.ndarray, seconds: float) -> None:
        """A known speaker, from the fingerprint of a reference clip of `seconds`; a lettered
        voice that is this speaker (heard before the clip's fingerprint came) joins it."""
        vector = unit(np.asarray(fingerprint, np.float32)) * np.float32(seconds)
        self.voices.append(Voice(name, vector, known=True, seconds=seconds))
        self._merge()

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
        moved = self._merge()
        parts = [Part(p.start, p.end, moved.get(p.speaker, p.speaker)) for p in parts]
        self.said.update(p.speaker for p in parts)
        return parts

    def centroid(self, name: str) -> np.ndarray | None:
        name = self.aliases.get(name, name)
        voice = next((v for v in self.voices if v.name == name), None)
        return None if voice is None else voice.centroid

    def _merge(self) -> dict[str, str]:
        """Merge every two voices that are one speaker (see the module's doc), the closest
        pair first; which name each merged-away one now goes by."""
        moved: dict[str, str] = {}
        while True:
            best, pair = MERGE_AT, None
            for i, j in itertools.combinations(range(len(self.voices)), 2):
                a, b = self.voices[i], self.voices[j]
                if (a.known and b.known) or not (a.seconds and b.seconds):
                    continue
                score = float(a.total @ b.total) / (a.seconds * b.seconds)
                if score >= best:
                    best, pair = score, (a, b)
            if pair is None:
                return moved
            a, b = pair
            keep, gone = (b, a) if b.known or (not a.known and b.seconds > a.seconds) else pair
            keep.total, keep.seconds = keep.total + gone.total, keep.seconds + gone.seconds
            self.voices.remove(gone)
            moved[gone.name] = keep.name
            if gone.name not in self.said and gone.name == letter(self.lettered - 1):
                self.lettered -= 1  # (a letter never said is given again)
            else:
                self.aliases[gone.name] = keep.name
            for names in (self.aliases, moved):
                for old, new in names.items():
                    if new == gone.name:
                        names[old] = keep.name
            if self.last == gone.name:
                self.last = keep.name

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
        if best >= SPLIT_ALONE:  # a change unless both sides are nearest one voice (issue 58)
            left, right = vectors[lo:cut].sum(0), vectors[cut:hi].sum(0)
            nearest = self._nearest(left)
            if nearest is not None and nearest == self._nearest(right):
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
            self.voices.append(Voice(letter(self.lettered), np.zeros_like(vector)))
            self.lettered += 1
            index = len(self.voices) - 1
        voice = self.voices[index]
        voice.total, voice.seconds = voice.total + vector, voice.seconds + seconds
        self.last = voice.name
        return voice.name
