"""TurnDetector: VAD frames and their speech flags in, turn events out.

Synchronous and free of inference: it frames the audio, keeps the pre-roll (prefix
padding), the open utterance and the silence count, and says where a turn starts, where
the final may start early, where the silence ends the turn, where maximum length cuts it,
and when a partial is due. StreamSession (`session.py`) acts on these events.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..audio.pcm import SAMPLE_RATE
from ..audio.vad import FRAME
from .utterance import Utterance

EARLY_FINAL_MS = 450  # start the final this long before the end-of-utterance silence is due
FIRST_PARTIAL_S = 0.3  # speech before an utterance's first partial (then every interval)
MAX_CUT_SEARCH_S = 3.0  # a cut at maximum length is at the quietest point of this tail


class TurnConfig(Protocol):
    """What turn detection reads of the stream config (session.StreamConfig)."""

    @property
    def use_vad(self) -> bool: ...
    @property
    def end_silence_ms(self) -> int: ...
    @property
    def prefix_padding_ms(self) -> int: ...
    @property
    def partial_interval_s(self) -> float: ...
    @property
    def max_utterance_s(self) -> float: ...
    @property
    def idle_timeout_ms(self) -> int | None: ...


@dataclass(frozen=True)
class TurnStarted:
    """Speech opened `utt` (with up to the prefix padding of audio before it)."""

    utt: Utterance


@dataclass(frozen=True)
class SpeechResumed:
    """Speech after silence inside the open utterance: an early final is stale."""


@dataclass(frozen=True)
class EarlyFinalPoint:
    """The silence is most of the way to ending `utt` (server VAD): its final may start."""

    utt: Utterance


@dataclass(frozen=True)
class TurnEnded:
    """The silence ended `utt` (server VAD). `take()` it to commit."""

    utt: Utterance
    at_ms: int


@dataclass(frozen=True)
class MaxLengthCut:
    """`head` reached maximum length and was cut at its quietest point; it is taken, and the
    rest of its audio goes on as the new open utterance."""

    head: Utterance
    padded: int  # samples of `head` that are padding


@dataclass(frozen=True)
class IdleTimeout:
    """Server VAD with `idle_timeout_ms`: no speech from `start_ms` to `end_ms` (that long)
    and no open utterance. `utterance` is the number of the empty item to commit."""

    utterance: int
    start_ms: int
    end_ms: int


@dataclass(frozen=True)
class PartialDue:
    """`partial_interval_s` of new speech since the last partial started."""

    utt: Utterance


TurnEvent = (
    TurnStarted
    | SpeechResumed
    | EarlyFinalPoint
    | TurnEnded
    | MaxLengthCut
    | IdleTimeout
    | PartialDue
)


class TurnDetector:
    def __init__(self, config: TurnConfig) -> None:
        self.config = config
        self._ids = itertools.count(1)
        self._leftover = np.zeros(0, dtype=np.float32)
        self._preroll: list[np.ndarray] = []
        self.utterance: Utterance | None = None  # the open utterance
        self.silence = 0  # samples of non-speech since the last speech frame
        self._since_partial = 0  # samples of speech since the last partial was started
        self.pos = 0  # the client's samples consumed by the framing (the last frame's end)
        self._padded = 0  # samples of the open utterance that are padding, not client audio
        self.idle = 0  # samples without speech and without an open utterance (idle timeout)

    # -- framing -------------------------------------------------------------------------
    def frames(self, samples: np.ndarray) -> np.ndarray:
        """The whole VAD frames of the audio so far; the rest waits for the next call."""
        data = np.concatenate([self._leftover, samples]) if len(self._leftover) else samples
        whole = len(data) - len(data) % FRAME
        self._leftover = data[whole:].copy()
        return data[:whole]

    def pad_leftover(self) -> None:
        """Flush: the last part frame, zero-filled, joins the open utterance (the fill counts
        as padding)."""
        if not len(self._leftover):
            return
        frame = np.zeros(FRAME, dtype=np.float32)
        frame[: len(self._leftover)] = self._leftover
        if self.utterance is not None:
            self.utterance.add(frame)
            self._padded += FRAME - len(self._leftover)
        # the stream's clock counts the client's samples only: times stay inside its audio
        self.pos += len(self._leftover)
        self._leftover = np.zeros(0, dtype=np.float32)

    # -- turns ---------------------------------------------------------------------------
    def step(self, frame: np.ndarray, speech: bool) -> list[TurnEvent]:
        """One frame of FRAME samples and whether it is speech."""
        cfg = self.config
        self.pos += FRAME
        utt = self.utterance
        if utt is None:
            if not speech:
                self._preroll.append(frame)
                keep = max(1, cfg.prefix_padding_ms * SAMPLE_RATE // 1000 // FRAME)
                del self._preroll[:-keep]
                return self._idle()
            return [TurnStarted(self._start(frame))]
        events: list[TurnEvent] = []
        utt.add(frame)
        if speech:
            if self.silence:
                events.append(SpeechResumed())
            self.silence = 0
            self._since_partial += FRAME
        else:
            self.silence += FRAME
        end_silence = cfg.end_silence_ms * SAMPLE_RATE // 1000
        early_at = max(FRAME, end_silence - EARLY_FINAL_MS * SAMPLE_RATE // 1000)
        if cfg.use_vad and early_at <= self.silence < end_silence:
            events.append(EarlyFinalPoint(utt))
        if cfg.use_vad and self.silence >= end_silence:
            events.append(TurnEnded(utt, self.ms(self.pos)))
        elif utt.length + FRAME > int(cfg.max_utterance_s * SAMPLE_RATE):
            events.append(self._cut(utt))
        elif self._since_partial >= cfg.partial_interval_s * SAMPLE_RATE:
            events.append(PartialDue(utt))
        return events

    def _idle(self) -> list[TurnEvent]:
        """One more silent frame with no utterance open: the idle timeout when it is due."""
        self.idle += FRAME
        timeout = self.config.idle_timeout_ms
        if not (self.config.use_vad and timeout and self.idle * 1000 >= timeout * SAMPLE_RATE):
            return []
        start = self.pos - self.idle
        self.idle = 0
        return [IdleTimeout(next(self._ids), self.ms(start), self.ms(self.pos))]

    @property
    def buffered(self) -> int:
        """Samples of the client's audio in the open utterance not yet committed (its part
        frame included, padding not): what a flush would commit."""
        if self.utterance is None:
            return 0
        return self.utterance.length - self._padded + len(self._leftover)

    def partial_started(self) -> None:
        self._since_partial = 0

    def take(self) -> tuple[Utterance | None, int]:
        """Close the open utterance: it and how many of its samples are padding."""
        utt, self.utterance = self.utterance, None
        padded, self._padded = self._padded, 0
        self.idle = self.silence if utt is not None else self.idle  # silence since speech
        self.silence = 0
        return utt, padded

    def clear(self) -> None:
        """Drop the open utterance and the part frame (OpenAI's input_audio_buffer.clear)."""
        self.utterance = None
        self.silence = 0
        self.idle = 0
        self._leftover = np.zeros(0, dtype=np.float32)

    def reset(self) -> None:
        self._preroll = []

    def _new_utterance(self, start_sample: int) -> Utterance:
        capacity = int(self.config.max_utterance_s * SAMPLE_RATE) + FRAME * 2
        return Utterance(next(self._ids), capacity, start_sample)

    def _start(self, frame: np.ndarray) -> Utterance:
        pre = np.concatenate(self._preroll) if self._preroll else np.zeros(0, np.float32)
        self._preroll = []
        utt = self._new_utterance(max(0, self.pos - FRAME - len(pre)))
        utt.add(pre[: len(utt.buf) - FRAME])  # room for the frame
        utt.add(frame)
        self.utterance = utt
        self.silence = 0
        self.idle = 0
        interval = self.config.partial_interval_s
        first = min(FIRST_PARTIAL_S, interval)
        self._since_partial = FRAME + int((interval - first) * SAMPLE_RATE)
        return utt

    def _cut(self, utt: Utterance) -> MaxLengthCut:
        """Maximum length: `utt` ends at the quietest point of its last 3 s; the rest opens
        the next utterance."""
        cut = utt.quietest_cut(MAX_CUT_SEARCH_S)
        rest = utt.audio[cut:].copy()
        utt.length = cut
        _, padded = self.take()
        self.utterance = self._new_utterance(utt.start_sample + cut)
        self.utterance.add(rest)
        self._since_partial = len(rest)
        return MaxLengthCut(utt, padded)

    @staticmethod
    def ms(samples: int) -> int:
        return samples * 1000 // SAMPLE_RATE
