"""A long file, planned and put back together: how long its segments may be, and how each
segment's result is mapped back onto the file's timeline and merged.

Pure functions on plain data: the service schedules the segments, this module decides their
limits and remaps their times (segment offset, then the pauses `compaction` shortened).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..audio.compaction import Compacted
from ..audio.decode import Audio
from ..audio.pcm import SAMPLE_RATE
from ..audio.segmentation import Span
from ..engines.base import ALIGNER_MAX_SECONDS, TranscribeResult
from ..text import collapse_repetitions, join_texts
from ..transcript import Segment, TokenLogprob, TokenUsage, Transcript, Word
from .timestamps import ensure_words

# A long file's first segment is cut at a pause within its first 10 s: it runs alone, so the
# first SSE event comes early, while the segments behind it fill a batch.
FIRST_SEGMENT_SECONDS = 10.0


@dataclass(frozen=True)
class Plan:
    """How a file is cut: `limit` caps every segment below the segmenter's own maximum
    (None: no cap), `long_form` says that the file needs more than one segment."""

    limit: int | None  # samples
    long_form: bool

    def first_limit(self, total: int) -> int | None:
        """The first segment's cap, for a file of `total` samples (after compaction)."""
        if not self.long_form:
            return self.limit
        return min(self.limit or total, int(FIRST_SEGMENT_SECONDS * SAMPLE_RATE))


def plan(total: int, max_samples: int, aligner: bool, max_seconds: float | None) -> Plan:
    """`aligner`: word times come from the forced aligner, which takes at most
    ALIGNER_MAX_SECONDS per call; `max_seconds`: a shorter limit (SSE_CHUNK_SECONDS)."""
    limits = []
    if aligner:
        limits.append(int(ALIGNER_MAX_SECONDS * SAMPLE_RATE))
    if max_seconds is not None:
        limits.append(int(max_seconds * SAMPLE_RATE))
    limit = min(limits, default=None)
    return Plan(limit, total > min(limit or max_samples, max_samples))


@dataclass
class SegmentResult:
    """One finished segment of a longer file, times relative to the whole file."""

    index: int
    span: Span
    text: str
    language: str | None
    segments: list[Segment]
    engine_seconds: float
    job_seconds: float
    word_source: str | None = None
    logprobs: list[TokenLogprob] | None = None
    usage: TokenUsage | None = None


def shift(
    index: int,
    span: Span,
    result: TranscribeResult,
    job_seconds: float,
    word_timestamps: bool,
    word_source: str,
    compacted: Compacted | None = None,
) -> SegmentResult:
    """One segment's result on the file's timeline: offset by the span's start, then mapped
    back through the shortened pauses (`compacted`); words spread where the engine gave
    none (`word_timestamps`)."""
    offset = span.start_s
    segments = []
    end = span.end_s  # an engine's times may overshoot its audio by a rounding step

    def start_at(t: float) -> float:
        t = min(t + offset, end)
        # a start at a shortened pause maps to its far side, so at the span's end (or
        # at a zero-length word on a pause) it would pass the end; end_at caps it below
        return compacted.to_original(t) if compacted is not None else t

    def end_at(t: float) -> float:
        t = min(t + offset, end)
        return compacted.to_original(t, end=True) if compacted is not None else t

    for s in split_at(result.segments, compacted, offset, end - offset):
        s.end = end_at(s.end)
        if compacted is not None:  # not in the silence before a shortened pause
            s.start = compacted.past_silence(min(s.start + offset, end)) - offset
        s.start = min(start_at(s.start), s.end)
        for w in s.words:  # (split_at kept each word on its side of a shortened pause)
            w.end = end_at(w.end)
            w.start = min(start_at(w.start), w.end)
        s.text = collapse_repetitions(s.text)
        if not word_timestamps:  # asked of the engine only to split at long pauses
            s.words = []
        if s.text:
            segments.append(s)
    source = None
    if word_timestamps:
        source = word_source if all(s.words for s in segments) else "estimate"
        ensure_words(segments)
    if compacted is not None:
        span = Span(
            compacted.original_sample(span.start), compacted.original_sample(span.end, True)
        )
    return SegmentResult(
        index=index,
        span=span,
        text=collapse_repetitions(result.text),
        language=result.language,
        segments=segments,
        engine_seconds=result.engine_seconds,
        job_seconds=job_seconds,
        word_source=source,
        logprobs=result.logprobs,
        usage=result.usage,
    )


def split_at(
    segments: list[Segment], compacted: Compacted | None, offset: float, length: float
) -> list[Segment]:
    """A segment that spans a long shortened pause (`Compacted.breaks`): its words on each
    side of it as segments of their own, from the first word's start to the last's end: on
    the original timeline a segment never spans the seconds removed, and starts where its
    speech does. Other segments, and those without words, keep their times; every word is
    kept to one piece. `offset`: the segment audio's start in the shortened audio;
    `length`: its length (times past it are capped)."""
    if compacted is None:
        return segments
    out: list[Segment] = []
    for s in segments:
        spans = [(min(w.start, length) + offset, min(w.end, length) + offset) for w in s.words]
        first, last = ((min(t, length) + offset) * SAMPLE_RATE for t in (s.start, s.end))
        if not s.words or not ((compacted.breaks > first) & (compacted.breaks < last)).any():
            for w, (a, b) in zip(s.words, spans, strict=True):
                a, b = compacted.within_piece(a, b)
                w.start, w.end = a - offset, b - offset
            out.append(s)
            continue
        groups: dict[int, list[Word]] = {}
        for w, (a, b), side in zip(s.words, spans, compacted.sides(spans), strict=True):
            lo, hi = compacted.side_bounds(side)  # kept to its side, then to one piece
            a, b = compacted.within_piece(min(max(a, lo), hi), min(max(b, lo), hi))
            w.start, w.end = a - offset, b - offset
            groups.setdefault(side, []).append(w)
        for words in groups.values():
            text = s.text if len(groups) == 1 else join_texts([w.word for w in words])
            start, stop = words[0].start, max(words[-1].end, words[0].start)
            out.append(replace(s, start=start, end=stop, text=text, words=words))
    return out


def overall_language(parts: list[SegmentResult], forced: str | None) -> str | None:
    """The forced language, else the one most segments with text were detected in."""
    languages = [p.language for p in parts if p.language and p.text]
    detected = max(set(languages), key=languages.count) if languages else None
    return forced or detected or (parts[0].language if parts else None)


def spoken_languages(parts: list[SegmentResult]) -> list[str]:
    """The languages of the segments with text, deduplicated in order of speech time."""
    out: list[str] = []
    for part in parts:
        if part.language and part.text and part.language not in out:
            out.append(part.language)
    return out


def merged_logprobs(parts: list[SegmentResult]) -> list[TokenLogprob] | None:
    if not parts or any(p.logprobs is None for p in parts if p.text):
        return None
    return [t for p in parts for t in p.logprobs or []]


def merged_usage(parts: list[SegmentResult]) -> TokenUsage | None:
    """Summed over the segments when the engine counted every one, else None."""
    if not parts or any(p.usage is None for p in parts):
        return None
    return sum((p.usage for p in parts if p.usage is not None), TokenUsage())


def merge(parts: list[SegmentResult], audio: Audio, language: str | None) -> Transcript:
    return Transcript(
        text=join_texts([p.text for p in parts]),
        language=overall_language(parts, language),
        duration=len(audio.samples) / SAMPLE_RATE,
        segments=[s for p in parts for s in p.segments],
        engine_seconds=sum(p.engine_seconds for p in parts),
        job_seconds=sum(p.job_seconds for p in parts),
        word_source=merged_word_source(parts),
        languages=spoken_languages(parts),
        logprobs=merged_logprobs(parts),
        usage=merged_usage(parts),
    )


def merged_word_source(parts: list[SegmentResult]) -> str | None:
    """`estimate` if any segment's words were spread over it, else the engine's source."""
    sources = {p.word_source for p in parts if p.word_source and p.text}
    return "estimate" if "estimate" in sources else min(sources, default=None)
