"""Transcription with speakers: the whole file is diarized once (so labels stay consistent
across an hour), beside its transcription, and the words are then cut at speaker turns
(`speakers.py`). Known speakers' reference clips are fingerprinted first.

The diarizer loads with the first diarized request and unloads with the model; it runs on a
worker thread beside the inference queue (one diarization at a time), not in the queue, so
a long file's diarization never holds up the real-time jobs. A request cancelled (its client
left) stops its diarization too (`stoppable`): senko's child is killed rather than left to
finish work nobody reads while it holds the diarizer and the idle unload.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from ..audio.budget import Reservation
from ..audio.decode import Audio, decode_audio
from ..audio.pcm import SAMPLE_RATE
from ..engines.base import EngineCrashedError, ShouldStop
from ..engines.speakers.diarize import Diarization
from ..engines.speakers.diarizing import DiarizingEngine, diarizing
from ..errors import (
    BadRequestError,
    ModelLoadError,
    NotConfiguredError,
    ServiceError,
    TooLargeError,
    UnavailableError,
)
from ..text import MAX_LABEL_CHARS, bad_label
from ..transcript import Segment, Transcript
from ..transcription.long_form import SegmentResult, merge
from ..transcription.service import Options, Transcriber
from .speakers import by_speaker, speaker_names

T = TypeVar("T")
MAX_KNOWN_SPEAKERS = 4  # as OpenAI documents
REFERENCE_SECONDS = (2.0, 10.0)


@dataclass(frozen=True)
class KnownSpeaker:
    name: str
    audio: np.ndarray  # 16 kHz mono


def known_speakers(
    names: list[str] | None,
    references: list[str] | None,
    budget: Reservation | None = None,
) -> list[KnownSpeaker]:
    """`known_speaker_names[]` with `known_speaker_references[]` (data URLs of 2-10 s clips);
    a clear 400 naming the field for anything else. Each clip is decoded no further than
    10 s (a header stating more is refused before decoding), within the request's share of
    the decoded-audio budget (`budget`), which then holds the clips."""
    names, references = names or [], references or []
    if len(names) != len(references):
        raise BadRequestError(
            f"known_speaker_names[] has {len(names)} entries and known_speaker_references[] "
            f"{len(references)}: give one reference clip per name.",
            param="known_speaker_references",
        )
    if len(names) > MAX_KNOWN_SPEAKERS:
        raise BadRequestError(
            f"At most {MAX_KNOWN_SPEAKERS} known speakers.", param="known_speaker_names"
        )
    if len({n.strip() for n in names}) != len(names) or not all(n.strip() for n in names):
        raise BadRequestError(
            "known_speaker_names[] must be distinct, non-empty names.", param="known_speaker_names"
        )
    for name in names:  # a name is a VTT voice tag (<v NAME>) and an SRT prefix ([NAME])
        lettered = re.fullmatch(r"[A-Z]{1,2}", name.strip()) is not None  # unknown speakers'
        if lettered or bad_label(name):
            raise BadRequestError(
                f"known_speaker_names[]: {name[:40]!r} must be at most {MAX_LABEL_CHARS} "
                "characters without <, >, [, ], --> or line breaks, and not a speaker letter "
                "(A, B, ... name the unknown speakers).",
                param="known_speaker_names",
            )
    speakers: list[KnownSpeaker] = []
    held = 0.0  # seconds of the clips decoded before this one
    for i, (name, url) in enumerate(zip(names, references, strict=True)):

        def reserve(seconds: float, before: float = held) -> None:
            if budget is not None:
                budget.grow_to(before + seconds)

        speakers.append(KnownSpeaker(name.strip(), reference_audio(i, url, reserve)))
        held += len(speakers[-1].audio) / SAMPLE_RATE
    return speakers


def reference_audio(
    index: int, url: str, reserve: Callable[[float], None] = lambda seconds: None
) -> np.ndarray:
    param = "known_speaker_references"
    header, _, data = url.partition(",")
    if not header.startswith("data:") or ";base64" not in header or not data:
        raise BadRequestError(
            f"known_speaker_references[{index}] must be a data URL (data:audio/wav;base64,...).",
            param=param,
        )
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequestError(
            f"known_speaker_references[{index}] is not valid base64.", param=param
        ) from None
    low, high = REFERENCE_SECONDS
    try:
        audio = decode_audio(
            io.BytesIO(raw),
            content_type=header[5:].split(";")[0] or None,
            max_seconds=high,  # a header stating more is refused first; decoding stops there
            reserve=reserve,
        )
    except UnavailableError:  # the decoded-audio budget is spent: 503, retry later
        raise
    except TooLargeError:
        raise BadRequestError(
            f"known_speaker_references[{index}] is longer than {high:g} s; a reference clip "
            f"must be {low:g}-{high:g} s.",
            param=param,
        ) from None
    except ServiceError as exc:
        raise BadRequestError(
            f"known_speaker_references[{index}]: {exc.message}", param=param
        ) from None
    if not low <= audio.duration <= high:
        raise BadRequestError(
            f"known_speaker_references[{index}] is {audio.duration:.1f} s long; a reference "
            f"clip must be {low:g}-{high:g} s.",
            param=param,
        )
    return audio.samples


@contextmanager
def diarizer_errors() -> Iterator[None]:
    """The diarizer's failures as API errors: it cannot load (501), or its process died
    (503: the next request gets a fresh one)."""
    try:
        yield
    except ModelLoadError as exc:
        raise NotConfiguredError(str(exc)) from exc
    except EngineCrashedError as exc:
        raise UnavailableError(str(exc), code="diarizer_exited", retry_after=1) from exc


async def stoppable(call: Callable[[np.ndarray, ShouldStop], T], samples: np.ndarray) -> T:
    """`call(samples, should_stop)` on a worker thread; if this is cancelled, `should_stop`
    turns true and the thread is awaited (a poll and a kill away), so whatever it held is
    free before the cancellation goes on."""
    stop = threading.Event()
    work = asyncio.ensure_future(asyncio.to_thread(call, samples, stop.is_set))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        stop.set()
        await asyncio.gather(work, return_exceptions=True)
        raise


class SpeakerTranscriber:
    """Transcriptions with speakers, for the upload routes."""

    def __init__(self, transcriber: Transcriber, max_seconds: float) -> None:
        self.transcriber = transcriber
        self.max_seconds = max_seconds

    def _engine(self) -> DiarizingEngine:
        engine = diarizing(self.transcriber.manager.engine)
        if engine is None:
            raise NotConfiguredError("Speaker diarization is not set up on this server.")
        return engine

    def check(self, audio: Audio) -> None:
        if audio.duration > self.max_seconds:
            raise TooLargeError(
                f"The audio is {audio.duration:.0f} s long; diarization takes at most "
                f"{self.max_seconds:g} s (DIARIZE_MAX_SECONDS).",
                param="file",
            )

    async def _diarize(self, samples: np.ndarray) -> Diarization:
        with diarizer_errors():
            return await stoppable(self._engine().diarize, samples)

    async def _voices(self, known: list[KnownSpeaker]) -> list[tuple[str, np.ndarray]]:
        voices = []
        for i, speaker in enumerate(known):
            with diarizer_errors():
                voice = await stoppable(self._engine().voice, speaker.audio)
            if voice is None:
                raise BadRequestError(
                    f"known_speaker_references[{i}] holds no speech.",
                    param="known_speaker_references",
                )
            voices.append((speaker.name, voice))
        return voices

    async def stream(
        self, audio: Audio, options: Options, known: list[KnownSpeaker]
    ) -> AsyncIterator[tuple[list[Segment], Transcript | None]]:
        """Speaker segments as they become final, in order; the last item also carries the
        whole transcript (its segments: one per speaker turn)."""
        self.check(audio)
        async with self.transcriber.manager.use():
            voices = await self._voices(known)
            job = asyncio.create_task(self._diarize(audio.samples))
            try:
                parts: list[SegmentResult] = []
                sent = 0
                async for part in self.transcriber.stream(audio, options):
                    parts.append(part)
                    if job.done():  # words up to this part are final: all but the open turn
                        current = self._assemble(parts, audio, options, job.result(), voices)
                        ready = current.segments[:-1]
                        if len(ready) > sent:
                            yield ready[sent:], None
                            sent = len(ready)
                diarization = await job
            finally:  # a client that left: its diarization stops before the model is let go
                if not job.done():
                    job.cancel()
                    await asyncio.gather(job, return_exceptions=True)
            result = self._assemble(parts, audio, options, diarization, voices)
            yield result.segments[sent:], result

    def _assemble(
        self,
        parts: list[SegmentResult],
        audio: Audio,
        options: Options,
        diarization: Diarization,
        voices: list[tuple[str, np.ndarray]],
    ) -> Transcript:
        merged = merge(parts, audio, options.request.language)
        names = speaker_names(diarization, voices)
        return by_speaker(merged, diarization, names, known={name for name, _ in voices})

    async def transcribe(
        self, audio: Audio, options: Options, known: list[KnownSpeaker]
    ) -> Transcript:
        result: Transcript | None = None
        async for _, whole in self.stream(audio, options, known):
            result = whole or result
        assert result is not None
        return result
