"""Shorten the long pauses of a long upload before it is cut into windows.

A whisper window is 30 s of audio whatever it holds, so seconds of silence between
sentences cost encoder and decoder time. Each quiet run (smoothed RMS below 1% of the
file's loud frames, about -40 dB) longer than `keep` seconds is shortened to `keep`: half
of it stays at each end, so words keep their edges and sentences stay apart. A run counts
only if every frame of it is quiet; "quiet" is relative to the file's loud parts, so speech
40 dB below a loud part that fills ≥ 5% of the file would be taken for a pause. Lengths
are in 10 ms steps.

The result is a map, not a copy: which pieces of the original are kept (`take` assembles
any stretch of the shortened audio, a segment at a time, so a long file is never held
twice), how times in it map back to the original timeline, and where the shortened pauses
are: the best places to cut it into windows.

A pause of LONG_PAUSE_S or more (`breaks`) is more than a breath: no segment may span it
once it is shortened, or on the original timeline the segment would cover the seconds
removed (the service cuts there, or splits a segment's words there). It keeps LONG_KEEP_S,
so a word whose times run a little into the pause (whisper's last word of a sentence, or
its first after a pause) still lies on its own side of the pause's middle. A multichannel
upload's channels are shortened only where every channel is quiet (`others`): on one side
of a call, the pauses are where the other side speaks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .pcm import SAMPLE_RATE

HOP = 160  # 10 ms energy frames
SMOOTH = 5  # frames: a 50 ms moving average, so one quiet frame inside a word is not a pause
QUIET = 0.01  # of the loud (95th percentile) frames' RMS: about -40 dB
BLOCK = 6000  # frames per energy block (60 s)
FLOOR = 1e-5  # RMS that is always quiet (digital silence), even in a very quiet file
MIN_TAIL = SAMPLE_RATE  # no cut at a pause in the last second
LONG_PAUSE_S = 1.0  # a shortened pause this long in the original: no segment spans it
LONG_KEEP_S = 0.8  # what is kept of it (at least `keep`)


@dataclass(frozen=True)
class Compacted:
    length: int  # samples in the shortened audio
    pauses: np.ndarray  # sample index in the shortened audio of each shortened pause's middle
    starts: np.ndarray  # sample index in the shortened audio where each kept piece starts
    origins: np.ndarray  # sample index in the original audio of each piece's start
    original_length: int
    breaks: np.ndarray  # those of `pauses` that were LONG_PAUSE_S or more in the original
    margin: int = 0  # samples of silence kept on each side of a break
    halves: np.ndarray | None = None  # per pause: the samples of silence kept before it

    def take(self, samples: np.ndarray, start: int, end: int) -> np.ndarray:
        """Samples [start, end) of the shortened audio, from the original `samples` (a view
        when they lie in one kept piece)."""
        first = max(0, int(np.searchsorted(self.starts, start, side="right")) - 1)
        last = max(0, int(np.searchsorted(self.starts, end, side="left")) - 1)
        parts = []
        for i in range(first, last + 1):
            a = max(start, int(self.starts[i]))
            b = min(end, int(self.starts[i + 1]) if i + 1 < len(self.starts) else self.length)
            origin = int(self.origins[i]) - int(self.starts[i])
            parts.append(samples[a + origin : b + origin])
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def to_original(self, seconds: float, end: bool = False) -> float:
        """A time in the shortened audio → the same moment in the original. A time at a
        shortened pause's middle is its far side; as an `end`, its near side."""
        sample = round(seconds * SAMPLE_RATE)
        i = max(0, int(np.searchsorted(self.starts, sample, side="left" if end else "right")) - 1)
        return min(int(self.origins[i]) + sample - int(self.starts[i]), self.original_length) / (
            SAMPLE_RATE
        )

    def within_piece(self, start: float, end: float) -> tuple[float, float]:
        """A word's times in the shortened audio, clipped to the one kept piece that holds
        most of it: a word never spans a shortened pause, which on the original timeline
        would stretch it over the seconds that were removed."""
        a, b = round(start * SAMPLE_RATE), round(end * SAMPLE_RATE)
        first = max(0, int(np.searchsorted(self.starts, a, side="right")) - 1)
        last = max(0, int(np.searchsorted(self.starts, b, side="left")) - 1)
        if last <= first:
            return start, end
        bounds = [*self.starts.tolist(), self.length]
        overlap = [min(b, bounds[i + 1]) - max(a, bounds[i]) for i in range(first, last + 1)]
        i = first + int(np.argmax(overlap))
        return max(a, bounds[i]) / SAMPLE_RATE, min(b, bounds[i + 1]) / SAMPLE_RATE

    def sides(self, spans: list[tuple[float, float]]) -> list[int]:
        """For each (start, end) in the shortened audio (seconds, in order: a segment's
        words), the stretch between breaks that holds it (0: before the first break): the
        one where it starts, outside the breaks' kept silence (whisper may end a sentence's
        last word seconds into the pause); for a word that starts in that silence, the one
        it overlaps most outside it. A word wholly in the silence (whisper may put a
        sentence's first word there) goes with its nearest neighbour that is not."""
        bounds = [-np.inf, *(self.breaks / SAMPLE_RATE).tolist(), np.inf]
        margin = self.margin / SAMPLE_RATE
        found: list[int | None] = []
        for a, b in spans:
            first = int(np.searchsorted(self.breaks, round(a * SAMPLE_RATE), side="right"))
            last = int(np.searchsorted(self.breaks, round(b * SAMPLE_RATE), side="right"))
            overlap = {
                i: min(b, bounds[i + 1] - margin) - max(a, bounds[i] + margin)
                for i in range(first, last + 1)
            }
            if bounds[first] + margin <= a < bounds[first + 1] - margin:  # starts in speech
                overlap = {first: 1.0}
            best = max(overlap, key=lambda i: overlap[i])
            found.append(best if overlap[best] > 0 else None)
        known = [(i, side) for i, side in enumerate(found) if side is not None]
        if not known:
            return [int(np.searchsorted(self.breaks, round(a * SAMPLE_RATE))) for a, _ in spans]
        return [
            side if side is not None else min(known, key=lambda k: abs(k[0] - i))[1]
            for i, side in enumerate(found)
        ]

    def past_silence(self, seconds: float) -> float:
        """A start in the silence kept before a shortened pause's middle moved to that
        middle (which maps to the pause's far side): the file's start, or a segment's that
        whisper put in the pause, is not its speech's, and the seconds removed there would
        put it that much too early on the original timeline."""
        if self.halves is None:
            return seconds
        sample = round(seconds * SAMPLE_RATE)
        i = int(np.searchsorted(self.pauses, sample, side="right"))
        if i < len(self.pauses) and self.pauses[i] - sample <= self.halves[i]:
            return float(self.pauses[i]) / SAMPLE_RATE
        return seconds

    def side_bounds(self, side: int) -> tuple[float, float]:
        """The stretch `side` (see `sides`) in the shortened audio, in seconds."""
        lo = int(self.breaks[side - 1]) if side > 0 else 0
        hi = int(self.breaks[side]) if side < len(self.breaks) else self.length
        return lo / SAMPLE_RATE, hi / SAMPLE_RATE

    def original_sample(self, sample: int, end: bool = False) -> int:
        if sample >= self.length:
            return self.original_length
        return round(self.to_original(sample / SAMPLE_RATE, end) * SAMPLE_RATE)


def quiet_frames(samples: np.ndarray, hops: int) -> np.ndarray:
    """Per 10 ms frame of the first `hops`: is it quiet (smoothed, relative to the loud
    frames of `samples`)?"""
    frames = samples[: hops * HOP].reshape(hops, HOP)  # a view: an hour is 230 MB
    energy = np.empty(hops)
    for i in range(0, hops, BLOCK):  # a minute at a time: no copy of the whole file
        block = frames[i : i + BLOCK].astype(np.float64)
        energy[i : i + BLOCK] = np.sqrt(np.mean(block * block, axis=1))
    energy = np.convolve(energy, np.ones(SMOOTH) / SMOOTH, "same")
    quiet: np.ndarray = energy < max(QUIET * float(np.percentile(energy, 95)), FLOOR)
    return quiet


def compact(
    samples: np.ndarray, keep_seconds: float, others: Sequence[np.ndarray] = ()
) -> Compacted | None:
    """The audio with every quiet run longer than `keep_seconds` shortened to it; None when
    there is none (nothing to gain, no copy). `others`: the other channels of a call, as
    long as `samples`; a run counts only where they are quiet too."""
    hops = len(samples) // HOP
    keep = max(1, round(keep_seconds * SAMPLE_RATE / HOP))
    if hops <= keep:
        return None
    quiet = quiet_frames(samples, hops)
    for other in others:  # never across the other side's speech
        quiet &= quiet_frames(other, hops)
    edges = np.diff(np.concatenate(([0], quiet.astype(np.int8), [0])))
    long_run, long_keep = (
        round(LONG_PAUSE_S * SAMPLE_RATE / HOP),
        round(LONG_KEEP_S * SAMPLE_RATE / HOP),
    )
    runs = [  # (first frame, end frame, frames kept)
        (int(s), int(e), max(keep, long_keep) if e - s >= long_run else keep)
        for s, e in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True)
    ]
    runs = [(s, e, k) for s, e, k in runs if e - s > k]
    if not runs:
        return None
    cuts = [((s + k // 2) * HOP, (e - (k - k // 2)) * HOP) for s, e, k in runs]
    pieces_from = [0, *(b for _, b in cuts)]
    pieces_to = [*(a for a, _ in cuts), len(samples)]
    lengths = np.array([b - a for a, b in zip(pieces_from, pieces_to, strict=True)])
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    long = np.array([e - s >= long_run for s, e, _ in runs], bool)
    return Compacted(
        length=int(lengths.sum()),
        pauses=starts[1:].copy(),
        starts=starts,
        origins=np.array(pieces_from),
        original_length=len(samples),
        breaks=starts[1:][long],
        margin=max(keep, long_keep) // 2 * HOP,
        halves=np.array([k // 2 * HOP for _, _, k in runs]),
    )


class Source:
    """What a file is cut from: its samples, shortened by `compacted` if given."""

    def __init__(self, samples: np.ndarray, compacted: Compacted | None = None) -> None:
        self.samples = samples
        self.compacted = compacted
        self.length = compacted.length if compacted is not None else len(samples)

    def take(self, start: int, end: int) -> np.ndarray:
        if self.compacted is None:
            return self.samples[start:end]  # a view
        return self.compacted.take(self.samples, start, end)

    def pauses_after(self, pos: int) -> np.ndarray | None:
        """The shortened pauses' positions after `pos`, relative to it (None: not known).
        Not those in the last second: a cut there would leave a segment of near-silence."""
        if self.compacted is None:
            return None
        pauses = self.compacted.pauses
        return pauses[(pauses > pos) & (pauses < self.length - MIN_TAIL)] - pos

    def breaks_after(self, pos: int) -> np.ndarray:
        """The long pauses (`Compacted.breaks`) after `pos`, relative to it: where a segment
        must end when the engine gives no word times to split one at."""
        if self.compacted is None:
            return np.zeros(0, np.int64)
        breaks = self.compacted.breaks
        return breaks[breaks > pos] - pos
