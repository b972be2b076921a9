"""The shapes every response format is built from: words, segments (in seconds) and a
whole file's transcript.

A bottom module: it imports nothing from the package, so engines, the service and the
formats (json, srt, vtt, subtitles, timestamps) can all share it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Word:
    word: str
    start: float
    end: float
    probability: float | None = None


@dataclass
class Segment:
    start: float
    end: float
    text: str
    words: list[Word] = field(default_factory=list)
    avg_logprob: float | None = None
    no_speech_prob: float | None = None
    compression_ratio: float | None = None
    tokens: list[int] = field(default_factory=list)


@dataclass
class Transcript:
    """A whole file's transcript: what every response format is built from."""

    text: str
    language: str | None  # ISO code
    duration: float
    segments: list[Segment] = field(default_factory=list)
    engine_seconds: float = 0.0  # inside the engine, all segments
    job_seconds: float = 0.0  # queue wait + engine, as the caller saw it
    word_source: str | None = None  # where word times came from: native|aligner|estimate
