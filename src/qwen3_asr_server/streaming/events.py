"""What a StreamSession tells its transport: small typed events, one per kind.

Each protocol maps them to its own wire format (`api/seed/wire.py`: the seed's
messages; `api/openai/realtime_wire.py`: OpenAI's Realtime server events). Times are
milliseconds of the session's audio; `utterance` numbers the utterances from 1.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..errors import ServiceError
from ..transcript import TokenLogprob, TokenUsage


@dataclass(frozen=True)
class SpeechStarted:
    """Voice detection opened an utterance (it starts up to the prefix padding earlier)."""

    utterance: int
    at_ms: int


@dataclass(frozen=True)
class SpeechStopped:
    """The end-of-utterance silence is complete (server VAD only); a commit follows."""

    utterance: int
    at_ms: int


@dataclass(frozen=True)
class TimedOut:
    """Server VAD heard no speech for the session's `idle_timeout_ms` (from `start_ms` to
    `end_ms`); an empty item, numbered `utterance`, is committed next."""

    utterance: int
    start_ms: int
    end_ms: int


@dataclass(frozen=True)
class Committed:
    """The utterance is closed and waits for its final (`reason`: silence, max_length,
    flush, commit, reset, idle_timeout, or the close reason)."""

    utterance: int
    reason: str


@dataclass(frozen=True)
class Partial:
    """A hypothesis of the open utterance; `text` starts with `stable_text`, which only
    grows within an utterance. `logprobs` (when the session asks for them): the tokens of
    the decode the hypothesis came from, in order (they spell its text)."""

    utterance: int
    text: str
    stable_text: str
    logprobs: tuple[TokenLogprob, ...] | None = None


@dataclass(frozen=True)
class Final:
    """The committed utterance's transcript. `answers`: the flushes sent while it was
    pending, which it answers; `duration`: the client's audio in it, in seconds, without
    the padding the server added. `language`: the detected (or forced) ISO code;
    `logprobs` (when the session's decoding asked) and `usage` (tokens) when the engine
    gave them. `start`/`end`: where its audio lies in the stream, in seconds since the
    stream began. `speaker` (with `diarized`, the session asked for speakers): who speaks
    it, None when that could not be said in time. A final split at a change of speaker
    is several Final events of one utterance, in order; only the last answers, and every
    part but the last has `more` (more of its utterance follows)."""

    utterance: int
    text: str
    reason: str
    answers: tuple[str, ...]
    duration: float
    language: str | None = None
    logprobs: tuple[TokenLogprob, ...] | None = None
    usage: TokenUsage | None = None
    start: float = 0.0
    end: float = 0.0
    speaker: str | None = None
    diarized: bool = False
    more: bool = False


@dataclass(frozen=True)
class FinalFailed:
    """The committed utterance could not be transcribed: why (a domain error; each protocol
    says it in its own words), plus what its final would have answered."""

    utterance: int
    reason: str
    answers: tuple[str, ...]
    duration: float
    error: ServiceError
    start: float = 0.0  # where its audio lies in the stream (seconds)
    end: float = 0.0


StreamEvent = SpeechStarted | SpeechStopped | TimedOut | Committed | Partial | Final | FinalFailed
Emit = Callable[[StreamEvent], Awaitable[None]]
