"""The shapes every response format is built from: words, segments (in seconds) and a
whole file's transcript.

A bottom module: it imports nothing from the package, so engines, the service and the
formats (json, srt, vtt, subtitles, timestamps) can all share it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenLogprob:
    """One generated text token: its text, UTF-8 bytes and natural-log probability (≤ 0)."""

    token: str
    logprob: float
    bytes: tuple[int, ...] = ()


@dataclass(frozen=True)
class TokenUsage:
    """Tokens an engine counted for a call (OpenAI's `usage` of type `tokens`)."""

    audio_tokens: int = 0  # the audio encoder's output positions fed to the decoder
    text_tokens: int = 0  # prompt text tokens (system turn, template)
    output_tokens: int = 0  # generated tokens

    @property
    def input_tokens(self) -> int:
        return self.audio_tokens + self.text_tokens

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            self.audio_tokens + other.audio_tokens,
            self.text_tokens + other.text_tokens,
            self.output_tokens + other.output_tokens,
        )


@dataclass
class Word:
    word: str
    start: float
    end: float
    probability: float | None = None
    channel: int | None = None  # multichannel uploads: the channel it was spoken on


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
    speaker: str | None = None  # with diarization: `A`, `B`, ... or a known speaker's name
    channel: int | None = None  # multichannel uploads: its channel (0-based); speaker: its name


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
    # detected languages (ISO codes), deduplicated in order of speech time; [] = none known
    languages: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None  # when asked for and the engine has them
    usage: TokenUsage | None = None  # when the engine counts tokens
