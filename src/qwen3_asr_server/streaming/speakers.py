"""Live speakers for one stream (one channel of a multichannel stream): each final's audio is
fingerprinted by the shared diarizer child (`runtime/voices.py`, batched with every other
stream's) from the moment it is committed, or from the early final's start, and labelled
in order of the finals (`voices.Speakers`), when the final's text is ready.

A final never waits long for its speaker: `wait_s` after its text is ready, it goes out
with `speaker: null`, and the shared service is told why (`missed`: /health and the log
say it). Known speakers' reference clips are fingerprinted in the same way, once, before
the first final that needs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..audio.pcm import SAMPLE_RATE, quietest_point
from .config import StreamConfig
from .voices import Part, Speakers, unit, windows

# A change of speaker found between two windows is placed finely: 1 s windows every 0.25 s
# within 1.5 s of it are fingerprinted, then it is cut at the quietest point this close
FINE_WINDOW_S, FINE_HOP_S, FINE_SPAN_S = 1.0, 0.25, 1.5
CUT_SEARCH_S = 0.3
COLD_START_WAIT_S = 30.0  # a final waits this long at most for a cold fingerprint child


class VoiceSource(Protocol):
    """The shared fingerprint service (runtime.voices.Voices)."""

    async def embed(self, clips: list[np.ndarray]) -> np.ndarray: ...

    async def ready(self) -> None:
        """Returns when a cold start of the service is over (at once when none is)."""
        ...

    def missed(self, reason: str) -> None: ...

    def open(self) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class KnownVoice:
    """A known speaker: its name and a 2-10 s reference clip (16 kHz)."""

    name: str
    audio: np.ndarray


@dataclass(frozen=True)
class Prints:
    """An utterance's window bounds (samples) and their fingerprints."""

    bounds: list[tuple[int, int]]
    vectors: np.ndarray


class SpeakerLabels:
    """One stream's speakers: `fingerprint` at commit, `parts` when the text is ready."""

    def __init__(self, source: VoiceSource, wait_s: float, split: bool = True) -> None:
        self._source = source
        self.wait_s = wait_s
        self.split = split  # a final whose speaker changes becomes one final per speaker
        self.speakers = Speakers()
        self._unprinted: list[KnownVoice] = []  # known speakers not fingerprinted yet
        self._known: asyncio.Task[np.ndarray] | None = None  # their fingerprints, coming
        self._open = True
        source.open()

    def close(self) -> None:
        if self._open:
            self._open = False
            self._source.close()
            if self._known is not None:
                self._known.cancel()

    def know(self, known: Sequence[KnownVoice]) -> None:
        """Known speakers from now on (their clips fingerprinted in the background); every
        earlier known speaker is forgotten, the lettered ones kept."""
        self.speakers.voices = [v for v in self.speakers.voices if not v.known]
        if self._known is not None:
            self._known.cancel()
            self._known = None
        self._unprinted = list(known)
        self._known_task()

    def _known_task(self) -> asyncio.Task[np.ndarray] | None:
        """The known speakers' fingerprints, asked for (again, after a failure) if needed."""
        if self._known is None and self._unprinted:
            clips = [k.audio for k in self._unprinted]
            self._known = asyncio.create_task(self._source.embed(clips))
            self._known.add_done_callback(retrieved)
        return self._known

    def fingerprint(self, audio: np.ndarray) -> asyncio.Task[Prints]:
        """Start fingerprinting a final's audio (the client's, without padding)."""
        task = asyncio.create_task(self._prints(np.asarray(audio, dtype=np.float32)))
        task.add_done_callback(retrieved)  # a stream that ends may never wait for it
        return task

    async def _prints(self, audio: np.ndarray) -> Prints:
        bounds = windows(len(audio))
        if not bounds:
            return Prints([], np.zeros((0, 0), np.float32))
        vectors = await self._source.embed([audio[a:b] for a, b in bounds])
        return Prints(bounds, vectors)

    async def parts(self, prints: asyncio.Task[Prints], samples: int) -> list[Part] | None:
        """Who speaks the final of `samples` (in order of the finals), waiting at most
        `wait_s` for its fingerprints; None (and the reason told) when they are late or
        failed. An empty list: too short to say, and nobody spoke before."""
        try:
            # a cold child (started when the stream opened) is waited for, within a bound:
            # the first finals of a stream must not lose their speakers to its start
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._source.ready(), COLD_START_WAIT_S)
            deadline = time.monotonic() + self.wait_s
            while (known := self._known_task()) is not None:
                try:
                    vectors = await asyncio.wait_for(asyncio.shield(known), self.wait_s)
                except asyncio.CancelledError:
                    if cancelled_here() or not self._open:
                        raise
                    if self._known is known:  # (never spin on a task that is gone)
                        self._known = None
                    continue  # a config replaced the known speakers: theirs, then
                except BaseException:
                    if known.done():  # failed: asked for again with the next final
                        self._known = None
                    raise
                self._seed_known(vectors)
            left = max(0.0, deadline - time.monotonic())
            result = await asyncio.wait_for(asyncio.shield(prints), left)
        except asyncio.CancelledError:
            if cancelled_here():
                raise  # the wait itself was cancelled (the session ends)
            # the fingerprints it waited for were dropped: a config turned speakers off.
            # The final goes on without a speaker; the stream and its finals go on.
            return None
        except TimeoutError:  # its voice still counts, when it comes: it is learned then
            prints.add_done_callback(lambda task: self._learn(task, samples))
            self._source.missed(f"slow: no voice fingerprint within {self.wait_s:g} s")
            return None
        except Exception as exc:
            self._source.missed(str(getattr(exc, "reason", None) or exc))
            return None
        return self.speakers.label(result.bounds, result.vectors, samples)

    def _learn(self, prints: asyncio.Task[Prints], samples: int) -> None:
        """A final's fingerprints that came too late for it: its speaker is learned (so the
        next finals of that voice get the same label), if the stream still labels."""
        if self._open and not prints.cancelled() and prints.exception() is None:
            result = prints.result()
            self.speakers.label(result.bounds, result.vectors, samples)

    def _seed_known(self, vectors: np.ndarray) -> None:
        for known, vector in zip(self._unprinted, vectors, strict=True):
            seconds = len(known.audio) / SAMPLE_RATE
            self.speakers.know(known.name, unit(vector), seconds)
        self._unprinted, self._known = [], None

    async def place(self, parts: list[Part], audio: np.ndarray, samples: int) -> list[Part]:
        """The parts of a final whose speaker changes, each change placed finely: short
        windows around it are fingerprinted, and the change goes where they turn from the
        first speaker's voice to the second's (kept at its window bound if they do not come
        within `wait_s`); then to the quietest point near it, so no word is cut in two. The
        last part reaches the end of `audio` (the final's audio, padding included); the
        client's audio is its first `samples`."""
        win, hop, span = (int(s * SAMPLE_RATE) for s in (FINE_WINDOW_S, FINE_HOP_S, FINE_SPAN_S))
        spans = []
        for before, after in itertools.pairwise(parts):
            lo, hi = max(before.start, after.start - span), min(after.end, after.start + span)
            spans.append(list(range(lo, max(lo, hi - win) + 1, hop)))
        clips = [audio[s : s + win] for starts in spans for s in starts]
        try:
            vectors = await asyncio.wait_for(self._source.embed(clips), self.wait_s)
        except Exception:  # (the child died or is slow: the window bounds stand)
            vectors = None
        out, start, used = [], 0, 0
        for i, part in enumerate(parts):
            end = len(audio)
            if i + 1 < len(parts):
                after = parts[i + 1]
                at = after.start
                if vectors is not None:
                    mine = vectors[used : used + len(spans[i])]
                    used += len(spans[i])
                    at = self._turn(mine, spans[i], win, part.speaker, after.speaker) or at
                near = int(CUT_SEARCH_S * SAMPLE_RATE)
                lo, hi = max(start + 1, at - near), min(samples - 1, at + near)
                end = lo + quietest_point(audio[lo:hi]) if hi > lo else at
            out.append(Part(start, end, part.speaker))
            start = end
        return out

    def _turn(
        self, vectors: np.ndarray, starts: list[int], win: int, first: str, second: str
    ) -> int | None:
        """Where short windows (`vectors`, starting at `starts`) turn from `first`'s voice
        to `second`'s: between the centres of the two windows that split them best."""
        a, b = self.speakers.centroid(first), self.speakers.centroid(second)
        if a is None or b is None or len(starts) < 2:
            return None
        lean = vectors @ b - vectors @ a  # > 0: nearer the second speaker
        gains = [float(lean[k:].sum() - lean[:k].sum()) for k in range(1, len(starts))]
        k = 1 + int(np.argmax(gains))
        return (starts[k - 1] + starts[k]) // 2 + win // 2


def retrieved(task: asyncio.Task[object]) -> None:
    """Mark a fingerprint task's failure as seen: the final that wanted it reports it (or has
    gone, at shutdown), so asyncio's "Task exception was never retrieved" is noise (issue 58
    §2.8)."""
    if not task.cancelled():
        task.exception()


def cancelled_here() -> bool:
    """Is the running task itself being cancelled (not a task it awaits through a shield)?
    A shielded task that is cancelled raises CancelledError in its waiter too (issue 58
    §2.1: a config cancelled the known speakers' fingerprints, and with them the stream's
    finals for good)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def follow(
    labels: SpeakerLabels | None, source: VoiceSource | None, config: StreamConfig
) -> SpeakerLabels | None:
    """A session's speaker labels as its config says: made when `diarize` turns on (the
    service must exist), closed when it turns off, else kept with the config's settings."""
    if config.diarize and labels is None:
        if source is None:
            raise ValueError("live speakers need the voice service")
        labels = SpeakerLabels(source, config.speaker_wait_s)
    elif not config.diarize and labels is not None:
        labels.close()
        return None
    if labels is not None:
        labels.wait_s = config.speaker_wait_s
        labels.split = config.split_speakers
    return labels
