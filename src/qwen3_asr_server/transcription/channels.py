"""Multichannel uploads (issue 44): a call recorded with one speaker per channel. Each
channel is transcribed on its own, cut at its own pauses (a stretch where it is silent is
never decoded), after the faint echo of the other side is silenced (`audio/channels.py`);
then the channels' segments are merged into one timeline by start time. Segments and words
carry their channel; a segment's speaker is the channel's name.

The merge orders by time, so segments must be placed well. On an engine whose segments
have no times of their own (Qwen: a window's segment starts where the window starts), each
channel is cut at its turns (voice detection, `speech_turns`), joined across the pauses in
which no other channel speaks (`joined_turns`: no cut is needed there). Whisper's windows keep their
context (and its accuracy), and its word times place each segment: a segment's words are
split at those turns (whisper may hold two turns of one side, with the other side's turn
between them, in one segment) and each part starts where voice detection hears its speech
start (whisper may start a window's first segment at the window's start). Pauses are
shortened only where every channel is quiet (`compact`'s `others`). Whisper's batched word
times move with what shares the batch, so a call's jobs share engine calls only with each
other, in groups the call fixes (`call_batches.py`): the same file, the same text.

Streamed (`stream_channels`), a segment is sent as soon as no channel can still produce an
earlier one: each channel's parts come in order, and a channel's next part starts after its
last part's span, so a segment starting before every channel's last span end is final."""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
import math
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import numpy as np
from loguru import logger

from ..audio.channels import without_echo
from ..audio.decode import Audio
from ..audio.segmentation import Span, joined_turns, speech_onset, speech_turns
from ..engines.wrapping import speech_prober
from ..errors import BadRequestError, ModelLoadError
from ..text import MAX_LABEL_CHARS, bad_label, join_texts
from ..transcript import Segment, TokenUsage, Transcript, Word
from .long_form import SegmentResult, merge
from .service import Options, Transcriber


def channel_names(names: list[str] | None, count: int) -> list[str]:
    """`channel_names[]` as given (one per channel), or `channel 0`, `channel 1`, ...

    A name becomes an SRT prefix (`[agent] `) and a VTT voice tag (`<v agent>`), so the
    rules of `known_speaker_names[]` apply: distinct, non-empty, at most MAX_LABEL_CHARS,
    without <, >, [, ] or line breaks (a line break and `-->` made a cue of their own),
    and without `-->` (which WebVTT forbids in a cue)."""
    if not names:
        return [f"channel {i}" for i in range(count)]
    names = [n.strip() for n in names]
    if len(names) != count or not all(names) or len(set(names)) != len(names):
        raise BadRequestError(
            f"channel_names[] has {len(names)} names for {count} channels: give one "
            "distinct, non-empty name per channel, in channel order.",
            param="channel_names",
        )
    for name in names:
        if bad_label(name):
            raise BadRequestError(
                f"channel_names[]: {name[:40]!r} must be at most {MAX_LABEL_CHARS} characters "
                "without <, >, [, ], --> or line breaks (it labels SRT and VTT cues).",
                param="channel_names",
            )
    return names


async def cleaned(tracks: list[Audio]) -> list[Audio]:
    """The tracks with each one's echo of the others silenced (off the event loop)."""
    samples = await asyncio.to_thread(without_echo, [t.samples for t in tracks])
    return [Audio(s, tracks[0].source_rate) for s in samples]


async def transcribe_channels(
    transcriber: Transcriber, tracks: list[Audio], options: Options, names: list[str]
) -> Transcript:
    async for item in stream_channels(transcriber, tracks, options, names):
        if isinstance(item, Transcript):
            return item
    raise AssertionError("stream_channels ends with the merged call")


async def stream_channels(
    transcriber: Transcriber, tracks: list[Audio], options: Options, names: list[str]
) -> AsyncIterator[Segment | Transcript]:
    """Each segment, tagged, in time order as soon as it is final; then the merged call."""
    audios = await cleaned(tracks)
    parts: list[list[SegmentResult]] = [[] for _ in audios]
    vad = transcriber.segmenter.vad
    heard: list[np.ndarray] = []  # each channel's speech probabilities
    async with transcriber.manager.use() as engine:
        by_turn = engine.word_timestamps != "native"
        # in the worker process when the model runs in one (onnxruntime stays out of here)
        probs = speech_prober(engine)
        try:
            if vad is not None:
                found = probs or (lambda samples: vad.stream().probs(samples))
                heard = await asyncio.to_thread(lambda: [found(a.samples) for a in audios])
        except ModelLoadError as exc:  # (the vad extra is not installed) cut as a mono file
            logger.warning("multichannel without voice detection: {}", exc)
    by_turn = by_turn and bool(heard)
    plans = await asyncio.to_thread(turn_plans, heard, audios) if heard else []
    asked = options.request.word_timestamps
    if plans and not by_turn:  # whisper's words place its segments at the turns
        options = replace(options, request=replace(options.request, word_timestamps=True))

    def keep(channel: int, part: SegmentResult) -> None:
        if plans and not by_turn:  # whisper's windows
            part.segments = at_turns(part.segments, plans[channel], heard[channel])
        tag(part.segments, channel, names[channel])
        for segment in part.segments if not asked else []:  # asked only to place segments
            segment.words = []
        parts[channel].append(part)

    samples = [a.samples for a in audios]
    # whisper: the call's jobs share engine calls only with each other, in groups the call
    # fixes, so its text never depends on what else is queued (issue 49, issue 58)
    batches = transcriber.call_batches(len(audios), options)
    streams = [
        turns(transcriber, a, plans[c], options)
        if by_turn
        else transcriber.stream(a, options, tuple(samples[:c] + samples[c + 1 :]), batches.seat(c))
        for c, a in enumerate(audios)
    ]
    async for segment in in_time_order(streams, keep):
        yield segment
    language = options.request.language
    results = [merge(p, a, language) for p, a in zip(parts, audios, strict=True)]
    for result in results if not asked else []:
        result.word_source = None
    yield merge_channels(results, names)


async def in_time_order(
    streams: list[AsyncIterator[SegmentResult]], keep: Callable[[int, SegmentResult], None]
) -> AsyncIterator[Segment]:
    """Every channel's parts, read at once (`keep` sees each as it comes); their segments
    in time order (channel order on a tie), each as soon as no channel can still produce
    an earlier one. A channel that fails fails the whole; the others are cancelled."""
    queue: asyncio.Queue[tuple[int, SegmentResult | Exception | None]] = asyncio.Queue()

    async def pump(channel: int, stream: AsyncIterator[SegmentResult]) -> None:
        try:
            async for part in stream:
                await queue.put((channel, part))
            await queue.put((channel, None))
        except Exception as exc:
            await queue.put((channel, exc))

    tasks = [asyncio.create_task(pump(c, s)) for c, s in enumerate(streams)]
    frontier = [0.0] * len(streams)  # where each channel's next segment starts, at least
    heap: list[tuple[float, int, int, Segment]] = []
    order = itertools.count()
    try:
        while not all(math.isinf(f) for f in frontier):
            channel, item = await queue.get()
            if isinstance(item, Exception):
                raise item
            if item is None:
                frontier[channel] = math.inf
            else:
                keep(channel, item)
                frontier[channel] = item.span.end_s
                for s in item.segments:
                    heapq.heappush(heap, (s.start, channel, next(order), s))
            while heap and heap[0][0] < min(frontier):  # (a tie waits: channel order)
                yield heapq.heappop(heap)[3]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def turn_plans(heard: list[np.ndarray], audios: list[Audio]) -> list[list[Span]]:
    """Each channel's turns, joined across the pauses in which no other channel speaks."""
    spans = [speech_turns(p, len(a.samples)) for p, a in zip(heard, audios, strict=True)]
    plans = []
    for c, mine in enumerate(spans):
        others = [s for o, theirs in enumerate(spans) if o != c for s in theirs]
        plans.append(joined_turns(mine, others))
    return plans


async def turns(
    transcriber: Transcriber, audio: Audio, spans: list[Span], options: Options
) -> AsyncIterator[SegmentResult]:
    """One channel cut at its turns, each turn transcribed alone (a few in flight, so
    they share decode steps), as parts in order on the call's timeline."""
    window: deque[tuple[int, Span, asyncio.Task[Transcript]]] = deque()
    size = transcriber.settings.max_batch_size + 1
    try:
        for index, span in enumerate(spans):
            turn = Audio(audio.samples[span.start : span.end], audio.source_rate)
            window.append((index, span, asyncio.create_task(transcriber.transcribe(turn, options))))
            while len(window) >= size or (window and index == len(spans) - 1):
                first, at, task = window.popleft()
                yield placed(first, at, await task)
    finally:
        for _, _, task in window:
            task.cancel()
        await asyncio.gather(*(task for _, _, task in window), return_exceptions=True)


def at_turns(segments: list[Segment], turns: list[Span], probs: np.ndarray) -> list[Segment]:
    """Whisper's segments placed at the channel's `turns`: a segment's words split by the
    turn each is nearest (a segment never spans the other side's turn), each part from
    where voice detection (`probs`) hears its speech start to its last word's end, inside
    its turn. A segment without words keeps its text, its start moved to its speech."""
    starts = [t.start_s for t in turns]
    out: list[Segment] = []
    for s in segments:
        if not s.words or not turns:
            s.start = min(speech_onset(probs, s.start, s.end), s.end)
            out.append(s)
            continue
        groups: dict[int, list[Word]] = {}
        for w in s.words:
            groups.setdefault(nearest(turns, starts, (w.start + w.end) / 2), []).append(w)
        for k, words in groups.items():
            turn = turns[k]
            stop = max(turn.start_s, min(max(w.end for w in words), turn.end_s))
            start = min(speech_onset(probs, max(words[0].start, turn.start_s), stop), stop)
            for w in words:  # inside the part
                w.start, w.end = min(max(w.start, start), stop), min(max(w.end, start), stop)
            text = s.text if len(groups) == 1 else join_texts([w.word for w in words])
            out.append(replace(s, start=start, end=stop, text=text, words=words))
    return out


def nearest(turns: list[Span], starts: list[float], t: float) -> int:
    """The index of the turn that holds `t`, else of the one nearest to it."""
    i = max(0, bisect.bisect_right(starts, t) - 1)
    near = [j for j in (i, i + 1) if j < len(turns)]
    return min(near, key=lambda j: max(turns[j].start_s - t, t - turns[j].end_s, 0.0))


def placed(index: int, span: Span, result: Transcript) -> SegmentResult:
    """A turn's transcript moved to where the turn is in the call."""
    offset = span.start_s
    for segment in result.segments:
        segment.start, segment.end = segment.start + offset, segment.end + offset
        for word in segment.words:
            word.start, word.end = word.start + offset, word.end + offset
    return SegmentResult(
        index, span, result.text, result.language, result.segments, result.engine_seconds,
        result.job_seconds, result.word_source, result.logprobs, result.usage,
    )  # fmt: skip


def tag(segments: list[Segment], channel: int, name: str) -> None:
    for segment in segments:
        segment.channel, segment.speaker = channel, name
        for word in segment.words:
            word.channel = channel


def merge_channels(results: list[Transcript], names: list[str]) -> Transcript:
    """One transcript in time order: every segment tagged with its channel and name."""
    segments: list[Segment] = []
    for channel, result in enumerate(results):
        tag(result.segments, channel, names[channel])
        segments.extend(result.segments)
    segments.sort(key=lambda s: (s.start, s.channel or 0))
    languages = list(dict.fromkeys(code for r in results for code in r.languages))
    usages = [r.usage for r in results]
    sources = {r.word_source for r in results if r.word_source}
    return Transcript(
        text=join_texts([s.text for s in segments]),
        language=next((r.language for r in results if r.language), None),
        duration=max(r.duration for r in results),
        segments=segments,
        engine_seconds=sum(r.engine_seconds for r in results),
        job_seconds=max(r.job_seconds for r in results),
        word_source="estimate" if "estimate" in sources else min(sources, default=None),
        languages=languages,
        logprobs=None,  # tokens of interleaved channels have no one order
        usage=None if None in usages else sum((u for u in usages if u), TokenUsage()),
    )
