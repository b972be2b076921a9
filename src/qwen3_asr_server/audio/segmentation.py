"""Cut long audio into segments of at most `max_seconds`, at pauses.

Only the last `search_seconds` before each forced cut are examined, so the cost is a few
VAD frames per segment, not a pass over the whole file. Segments are views into the
decoded array (`samples[start:end]`), never copies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from .pcm import SAMPLE_RATE, quietest_point
from .vad import FRAME, SileroModel

SPEECH_THRESHOLD = 0.35
MIN_PAUSE_S = 0.25  # a pause between sentences or phrases, not a gap inside a word


@dataclass(frozen=True)
class CutRules:
    """Where a long file may be cut: Silero's speech probability below `threshold` is a
    pause, and only a pause of `min_pause_s` or more is a place to cut (a request's
    `chunking_strategy` of type server_vad sets both)."""

    threshold: float = SPEECH_THRESHOLD
    min_pause_s: float = MIN_PAUSE_S


@dataclass(frozen=True)
class Span:
    start: int  # sample index, inclusive
    end: int  # sample index, exclusive

    @property
    def start_s(self) -> float:
        return self.start / SAMPLE_RATE

    @property
    def end_s(self) -> float:
        return self.end / SAMPLE_RATE


class Segmenter:
    def __init__(
        self,
        max_seconds: float = 30.0,
        vad: SileroModel | None = None,
        search_seconds: float = 8.0,
    ) -> None:
        self.max_samples = int(max_seconds * SAMPLE_RATE)
        self.search_samples = min(int(search_seconds * SAMPLE_RATE), self.max_samples // 2)
        self.vad = vad

    def spans(self, samples: np.ndarray) -> Iterator[Span]:
        """Yield consecutive spans covering `samples` exactly, each ≤ max_seconds."""
        pos, total = 0, len(samples)
        while pos < total:
            end = self.next_cut(samples, pos)
            yield Span(pos, end)
            pos = end

    def next_cut(
        self,
        samples: np.ndarray,
        pos: int,
        max_samples: int | None = None,
        pauses: np.ndarray | None = None,
        rules: CutRules | None = None,
        probs: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> int:
        """End of the segment that starts at `pos`: ≤ `max_samples` (default: the
        segmenter's) long, cut at a pause in its last `search_seconds`: the last of the
        known `pauses` (sample indexes, sorted) there, else one the VAD finds (`probs`: the
        speech probabilities from elsewhere, e.g. a worker process; else the segmenter's)."""
        total = len(samples)
        longest = min(max_samples or self.max_samples, self.max_samples)
        if total - pos <= longest:
            return total
        search = min(self.search_samples, longest // 2)
        lo = pos + longest - search
        if pauses is not None:
            known = pauses[(pauses > lo) & (pauses <= pos + longest)]
            if len(known):
                return int(known[-1])
        window = samples[lo : pos + longest]
        offset = (
            self._vad_pause(window, rules or CutRules(), probs) if self.vad is not None else None
        )
        if offset is None:
            offset = quietest_point(window)
        return lo + max(1, offset)

    def _vad_pause(
        self,
        window: np.ndarray,
        rules: CutRules,
        speech_probs: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> int | None:
        """Middle of the last pause of at least `min_pause_s` (the longest segments, so the
        fewest 30 s windows), else of the longest non-speech run; None if all is speech."""
        assert self.vad is not None
        probs = speech_probs(window) if speech_probs else self.vad.stream().probs(window)
        runs: list[tuple[int, int]] = []  # (first frame, frames) of each quiet run
        start = None
        for i, quiet in enumerate([*(probs < rules.threshold).tolist(), False]):
            if quiet and start is None:
                start = i
            elif not quiet and start is not None:
                runs.append((start, i - start))
                start = None
        if not runs:
            return None
        pauses = [r for r in runs if r[1] * FRAME >= rules.min_pause_s * SAMPLE_RATE]
        first, frames = pauses[-1] if pauses else max(runs, key=lambda r: r[1])
        return int((first + frames / 2) * FRAME)


TURN_PAUSE_S = 0.6  # on a channel with one speaker, a pause this long ends a turn
TURN_PAD_S = 0.2  # kept around each turn, so its first and last sounds are whole


def speech_turns(
    probs: np.ndarray, total: int, pause_s: float = TURN_PAUSE_S, pad_s: float = TURN_PAD_S
) -> list[Span]:
    """The speech of one voice as turns: runs of speech frames (VAD `probs` per FRAME)
    joined across pauses shorter than `pause_s`, each padded by `pad_s`, within `total`
    samples. A multichannel call's channel is cut at every turn, so engines that give a
    segment no times inside (Qwen without an aligner) still place each turn in time."""
    voiced = np.flatnonzero(probs >= SPEECH_THRESHOLD)
    if not len(voiced):
        return []
    gap = int(pause_s * SAMPLE_RATE / FRAME)
    breaks = np.flatnonzero(np.diff(voiced) > gap + 1)
    firsts = [voiced[0], *voiced[breaks + 1]]
    lasts = [*voiced[breaks], voiced[-1]]
    pad = int(pad_s * SAMPLE_RATE)
    return [
        Span(max(0, int(a) * FRAME - pad), min(total, (int(b) + 1) * FRAME + pad))
        for a, b in zip(firsts, lasts, strict=True)
    ]


def speech_onset(probs: np.ndarray, start_s: float, end_s: float) -> float:
    """Where speech starts in [start_s, end_s) by voice detection (`probs` per FRAME), less
    a little (TURN_PAD_S); `start_s` when it holds none. A decoder may start a window's
    first segment at the window's start, though the speech starts seconds later."""
    first, last = int(start_s * SAMPLE_RATE) // FRAME, int(end_s * SAMPLE_RATE) // FRAME + 1
    voiced = np.flatnonzero(probs[first:last] >= SPEECH_THRESHOLD)
    if not len(voiced):
        return start_s
    return max(start_s, (first + int(voiced[0])) * FRAME / SAMPLE_RATE - TURN_PAD_S)


def joined_turns(turns: list[Span], others: list[Span]) -> list[Span]:
    """A channel's turns joined across each pause in which no other channel speaks
    (`others`: their turns): only the other side's words need a cut to fall between."""
    joined: list[Span] = []
    for turn in turns:
        if joined and not any(o.start < turn.start and o.end > joined[-1].end for o in others):
            joined[-1] = Span(joined[-1].start, turn.end)
        else:
            joined.append(turn)
    return joined
