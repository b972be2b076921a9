"""Transcription service: validate, cut into segments, hold the model, schedule each
segment as its own job, merge in order, post-process."""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Hashable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..audio.compaction import Source, compact
from ..audio.decode import Audio
from ..audio.pcm import SAMPLE_RATE
from ..audio.segmentation import CutRules, Segmenter, Span
from ..audio.vad import may_be_silent, may_hold_speech
from ..config import Settings
from ..engines.base import (
    Engine,
    TranscribeRequest,
    TranscribeResult,
)
from ..engines.wrapping import SpeechProbs, speech_prober
from ..errors import (
    ModelLoadError,
    ModelUnavailableError,
)
from ..runtime.lifecycle import ModelManager
from ..runtime.metrics import Metrics
from ..runtime.scheduler import BATCH, PARTIAL, REALTIME, BatchSpec, PriorityScheduler
from ..text import collapse_repetitions
from ..transcript import Transcript
from .call_batches import CallBatches, Seat
from .decoding import build_decoding, resolve_language
from .long_form import SegmentResult, merge, plan, shift
from .scheduled import scheduled


@dataclass(frozen=True)
class Options:
    """An upload's wishes. `request` says how to decode every segment: a TranscribeRequest
    without audio (each segment's audio fills it in), so a new decoding field is added in
    one place (`engines/base.py`) and reaches every engine call of the file."""

    request: TranscribeRequest = field(default_factory=TranscribeRequest)
    priority: int = BATCH
    max_seconds: float | None = None  # a shorter segment limit (SSE_CHUNK_SECONDS)
    cut_rules: CutRules | None = None  # the request's chunking_strategy (server_vad)


class Transcriber:
    """Audio to text for the routes and the streaming sessions: validates the options, cuts a
    file at pauses, schedules each segment and merges them (`long_form.py`)."""

    def __init__(
        self,
        settings: Settings,
        manager: ModelManager,
        scheduler: PriorityScheduler,
        segmenter: Segmenter,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.manager = manager
        self.scheduler = scheduler
        self.segmenter = segmenter

    # -- validation (decoding.py) -------------------------------------------------------
    def resolve_language(self, value: str | None) -> str | None:
        """User input -> ISO code the engine accepts, None for auto; 400 otherwise."""
        return resolve_language(self.manager.engine, value)

    def decoding(self, **fields: Any) -> TranscribeRequest:
        """The checked, audio-less request for `decoding.build_decoding`'s fields."""
        return build_decoding(self.manager.engine, **fields)

    # -- transcription -----------------------------------------------------------------
    async def stream(
        self,
        audio: Audio,
        options: Options,
        others: tuple[np.ndarray, ...] = (),
        seat: Seat | None = None,
    ) -> AsyncIterator[SegmentResult]:
        """Transcribe segment by segment, yielding each as it finishes, in order.

        Each segment is its own scheduler job; with remote backends one per backend slot is
        in flight, so they share a long file. A real-time job still runs between
        two engine calls of a long upload, and if the consumer goes away the remaining
        segments are never submitted and those in flight are cancelled. `others`: the other
        channels of a call (pauses are shortened only where they are quiet too). `seat`: a
        call's channel, whose segments share engine calls only with the call's own, in
        groups the call fixes (`call_batches.py`; alone where the engine cannot batch them).

        No segment spans a long shortened pause (`Compacted.breaks`): an engine with word
        times of its own (whisper) is asked for them, and its segments are split at those
        pauses by their words (`shift`); the file of any other engine is cut there.
        """
        async with self.manager.use() as engine:
            pos, index, total = 0, 0, len(audio.samples)
            aligner = options.request.word_timestamps and engine.word_timestamps == "aligner"
            cuts = plan(total, self.segmenter.max_samples, aligner, options.max_seconds)
            limit, long_form = cuts.limit, cuts.long_form
            word_source = engine.word_timestamps if options.request.word_timestamps else ""
            # a client's chunking_strategy cuts the audio as it is: no pauses shortened first
            keep = 0.0 if options.cut_rules else self.settings.compact_pauses_ms / 1000
            # the long pauses of a long file are shortened first: fewer windows to decode
            compacted = (
                await asyncio.to_thread(compact, audio.samples, keep, others)
                if long_form and keep
                else None
            )
            asked = options.request.word_timestamps
            long_pauses = compacted is not None and len(compacted.breaks) > 0
            split = long_pauses and engine.word_timestamps == "native"
            if split and not asked:  # words to split segments at long pauses, then dropped
                options = replace(options, request=replace(options.request, word_timestamps=True))
            source = Source(audio.samples, compacted)
            total = source.length
            first = cuts.first_limit(total)
            # In flight: one per scheduler thread (remote backends share a long file), or a
            # batch queued behind the running segment when the engine decodes each item of a
            # batch as it would alone (a file's text must not depend on timing).
            size, fixed = self.scheduler.workers, seat is not None
            if self._batches(engine, options):
                size = max(size, self.settings.max_batch_size + 1)
            else:
                seat = None  # a call's jobs each alone: the same text whatever is queued
            cut = 0  # segments cut so far (a seat's index)
            window: deque[tuple[Span, asyncio.Task[TranscribeResult], float]] = deque()
            probs = speech_prober(engine)  # the worker's voice detection, if in one
            try:
                while pos < total or window:
                    while pos < total and len(window) < size:
                        most = first if pos == 0 else limit
                        end = await self._next_cut(
                            source, pos, most, options.cut_rules, split, probs
                        )
                        span = Span(pos, end)
                        # a long file's first segment runs alone, even when the engine
                        # is busy and the rest is queued with it: its event comes early
                        batch = not fixed and not (long_form and span.start == 0)
                        segment = source.take(span.start, span.end)
                        # checked here, in order, so segments reach the queue in order
                        heard = await self._hears_speech(segment, engine)
                        job = self._segment_job(
                            engine, segment, span, options, long_form, batch, heard, seat, cut
                        )
                        window.append((span, asyncio.create_task(job), time.perf_counter()))
                        pos, cut = end, cut + 1
                    if pos >= total and seat is not None:
                        seat.end(cut)
                    span, task, submitted = window.popleft()
                    result = await task
                    seconds = time.perf_counter() - submitted
                    yield shift(
                        index,
                        span,
                        result,
                        seconds,
                        asked,
                        word_source,
                        compacted,
                    )
                    index += 1
            finally:
                if seat is not None:
                    seat.end(cut)
                for _, task, _ in window:
                    task.cancel()
                await asyncio.gather(*(task for _, task, _ in window), return_exceptions=True)

    async def _hears_speech(self, samples: np.ndarray, engine: Engine) -> bool | None:
        """Whether the segment may hold speech: loud audio is taken as it is; a quiet
        segment is asked of voice detection (True without one: SEGMENT_VAD off). None: a
        quiet segment for an engine in a worker process, whose child asks its own voice
        detection (the server process then never loads onnxruntime for an upload)."""
        vad = self.segmenter.vad
        if vad is not None and engine.status().worker is not None:
            return None if await vad.run(may_be_silent, samples) else True
        return vad is None or await vad.run(may_hold_speech, vad, samples)

    def _batches(self, engine: Engine, options: Options) -> bool:
        """May a long file's segments share engine calls?"""
        probe = self._request(np.zeros(0, np.float32), options, long_form=True)
        return (
            self.settings.max_batch_size > 1
            and engine.long_form_batches
            and engine.batch_key(probe) is not None
        )

    @staticmethod
    def _request(samples: np.ndarray, options: Options, long_form: bool) -> TranscribeRequest:
        return replace(options.request, audio=samples, long_form=long_form)  # a view, no copy

    async def _segment_job(
        self,
        engine: Engine,
        samples: np.ndarray,
        span: Span,
        options: Options,
        long_form: bool,
        batch_ok: bool,
        heard: bool | None = True,
        seat: Seat | None = None,
        number: int = 0,
    ) -> TranscribeResult:
        if heard is False:  # silence never reaches the model: whisper and Qwen hear words in it
            if seat is not None:
                seat.skip(number)
            return TranscribeResult(text="", language=options.request.language)
        request = self._request(samples, options, long_form)
        if heard is None:  # the worker's child clears it first (`TranscribeRequest.quiet`)
            request = replace(request, quiet=True)
        if seat is not None:
            return await seat.run(number, request)
        batch_ok = batch_ok and self.settings.max_batch_size > 1
        key = engine.batch_key(request) if batch_ok else None
        batch = self._batch_spec(engine, key, request)
        call = functools.partial(engine.transcribe, request, self.scheduler.should_stop)
        seconds = span.end_s - span.start_s
        return await self._run(call, options.priority, batch, seconds, admitted=True)

    async def transcribe_realtime(
        self,
        audio: np.ndarray | Callable[[], np.ndarray],
        decoding: TranscribeRequest,
        *,
        partial: bool = False,
        draft: bool = False,
        background: bool = False,
    ) -> TranscribeResult:
        """One utterance (≤ ~30 s, no cutting): a final at REALTIME priority, a partial at
        PARTIAL priority. `audio` may be a function, called when the job starts, so that a
        partial that waited decodes the newest audio. `decoding` is the session's request
        without audio (language, prompt, keywords, candidate languages, logprobs). A whisper
        draft also has the words' probabilities (`word_probs`).

        Finals are never refused for queue depth (the session was admitted; WS_MAX_SESSIONS
        and its pending-audio cap bound it); a partial is refused (QueueFullError) when
        MAX_QUEUE jobs wait. `background`: the final of a client that has left, which no
        one waits for in real time, runs at upload priority."""
        should_stop = self.scheduler.should_stop

        seconds = [0.0]

        def request() -> TranscribeRequest:  # when the job starts: a partial's newest audio
            samples = audio() if callable(audio) else audio
            seconds[0] = len(samples) / SAMPLE_RATE
            return replace(decoding, audio=samples, draft=draft, partial=partial)

        def run(engine: Engine) -> TranscribeResult:
            # A draft (a partial) is ~4x faster on whisper, so a final rarely waits for one.
            return engine.transcribe(request(), should_stop)

        async with self.manager.use() as engine:
            priority = PARTIAL if partial else BATCH if background else REALTIME
            # Step by step (Qwen): finals and partials join the running rows between steps.
            key = engine.batch_key(decoding) if engine.steps else None
            batch = self._batch_spec(engine, key, request)
            result = await self._run(
                lambda: run(engine), priority, batch, lambda: seconds[0], admitted=not partial
            )
        result.text = collapse_repetitions(result.text)
        return result

    def call_batches(self, channels: int, options: Options) -> CallBatches:
        """The fixed groups of a call's jobs (`call_batches.py`): each group one job, one
        engine call, at the call's priority."""

        async def run(requests: list[TranscribeRequest]) -> list[TranscribeResult]:
            async with self.manager.use() as engine:
                should_stop = self.scheduler.should_stop
                call = functools.partial(engine.transcribe_batch, requests, should_stop)
                timeout, priority = self.settings.request_timeout, options.priority
                results = await scheduled(self.scheduler, call, priority, timeout, None, True)
            for request, result in zip(requests, results, strict=True):
                self._observe(options.priority, result, len(request.audio) / SAMPLE_RATE)
            return list(results)

        return CallBatches(channels, self.settings.max_batch_size, run)

    async def _run(
        self,
        call: Callable[[], TranscribeResult],
        priority: int,
        batch: BatchSpec | None = None,
        audio_seconds: float | Callable[[], float] = 0.0,
        admitted: bool = False,
    ) -> TranscribeResult:
        """Schedule one engine call; engine failures become API errors."""
        timeout = self.settings.request_timeout
        result = await scheduled(self.scheduler, call, priority, timeout, batch, admitted)
        self._observe(
            priority, result, audio_seconds() if callable(audio_seconds) else audio_seconds
        )
        return result

    def _observe(self, priority: int, result: TranscribeResult, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.observe_inference(
                self.manager.engine.name, priority, result.engine_seconds, seconds
            )

    def _batch_spec(self, engine: Engine, key: Hashable | None, item: Any) -> BatchSpec | None:
        """How the job may share the engine: whole calls (`transcribe_batch`), or rows that
        join between decode steps (`decode_rows`); None: alone."""
        if key is None:
            return None

        def run_many(items: list[Any]) -> list[Any]:
            requests = [i() if callable(i) else i for i in items]
            return list(engine.transcribe_batch(requests, self.scheduler.should_stop))

        return BatchSpec(key, item, run_many, engine.decode_rows if engine.steps else None)

    async def transcribe(self, audio: Audio, options: Options) -> Transcript:
        parts = [part async for part in self.stream(audio, options)]
        return merge(parts, audio, options.request.language)

    async def _next_cut(
        self,
        source: Source,
        pos: int,
        limit: int | None,
        rules: CutRules | None,
        split: bool,
        probs: SpeechProbs | None = None,
    ) -> int:
        longest = min(limit or self.segmenter.max_samples, self.segmenter.max_samples)
        breaks = source.breaks_after(pos)
        if not split and len(breaks) and breaks[0] < longest:  # no segment spans a long pause
            return pos + int(breaks[0])
        if source.length - pos <= longest:
            return source.length
        # from `pos`: one sample more than a segment, so the segmenter sees that more follows
        window = source.take(pos, min(source.length, pos + longest + 1))
        try:
            cut = await asyncio.to_thread(
                self.segmenter.next_cut, window, 0, limit, source.pauses_after(pos), rules, probs
            )
        except ModelLoadError as exc:
            raise ModelUnavailableError(str(exc)) from exc
        return pos + cut
