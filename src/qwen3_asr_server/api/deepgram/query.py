"""WS /v1/listen's query, as Deepgram's SDK and the agent frameworks send it: booleans as
`true`/`false`, lists as repeated parameters. Parsed once into `ListenQuery`; a value we
cannot serve is a `QueryError` (the handshake is refused with HTTP 400); values Deepgram
takes beyond our limits are cut to them (`endpointing`, `utterance_end_ms`, keywords). Parameters
we do not use (`punctuate`, `smart_format`, `model`, `tag`, ...) are accepted and ignored
(docs/DEEPGRAM.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from loguru import logger
from starlette.datastructures import QueryParams

from ...audio.channels import MAX_CHANNELS
from ...streaming.ingest import Encoding
from ...transcription.decoding import MAX_KEYWORD_CHARS, MAX_KEYWORDS, MAX_KEYWORDS_TOTAL_CHARS

LISTEN_ENCODINGS: dict[str, Encoding] = {"linear16": "pcm_s16le", "mulaw": "mulaw", "alaw": "alaw"}
RATES = (8000, 48000)  # the sample rates taken (any in between; resampled to 16 kHz)
ENDPOINTING_FLOOR_MS = 300  # below it our voice detection would cut at every pause
ENDPOINTING_CEILING_MS = 5000  # WS_END_SILENCE_MS's range
UTTERANCE_END_MS = (1000, 5000)  # utterance_end_ms: below, refused; above, 5000


class QueryError(ValueError):
    """A query value we cannot serve; the message names the parameter."""


@dataclass(frozen=True)
class ListenQuery:
    encoding: Encoding = "pcm_s16le"
    sniff: bool = False  # no `encoding`: the first bytes may be a WAV header (or a container)
    sample_rate: int = 16000
    channels: int = 1
    multichannel: bool = False
    language: str | None = None  # ISO code; None: detect
    keywords: list[str] = field(default_factory=list)
    interim_results: bool = False
    # end-of-speech silence in ms; None: WS_END_SILENCE_MS; Literal[False]: no endpointing
    endpointing: int | Literal[False] | None = None
    utterance_end_ms: int | None = None
    vad_events: bool = False
    diarize: bool = False


def flag(query: QueryParams, name: str) -> bool:
    value = (query.get(name) or "").strip().lower()
    if value in ("", "false", "0", "no", "off"):
        return False
    if value in ("true", "1", "yes", "on"):
        return True
    raise QueryError(f"{name} must be true or false, not {query.get(name)!r}.")


def integer(query: QueryParams, name: str, default: int, low: int, high: int) -> int:
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise QueryError(f"{name} must be an integer, not {raw!r}.") from None
    return in_range(name, value, low, high)


def in_range(name: str, value: int, low: int, high: int) -> int:
    """The query's check of a number (also a live WAV header's rate and channels)."""
    if not low <= value <= high:
        raise QueryError(f"{name} must be {low} to {high}, not {value}.")
    return value


def keyword(value: str) -> str:
    """Deepgram's `word:boost` (an intensifier) -> `word`; a colon in a term stays."""
    word, colon, boost = value.rpartition(":")
    if colon and word:
        try:
            float(boost)
        except ValueError:
            return value.strip()
        return word.strip()
    return value.strip()


def terms(query: QueryParams) -> list[str]:
    """`keywords` (a `:boost` dropped) and `keyterm` (as written: keyterms have no boosts),
    blanks and repeats dropped, cut to what our decoding takes (transcription/decoding.py's
    limits): Deepgram takes more, so the rest is logged at INFO, never refused."""
    words = [keyword(v) for v in query.getlist("keywords")]
    words += [" ".join(v.split()) for v in query.getlist("keyterm")]
    kept: list[str] = []
    dropped: list[str] = []
    total = 0
    for word in dict.fromkeys(" ".join(w.split()) for w in words if w.strip()):
        fits = len(word) <= MAX_KEYWORD_CHARS and total + len(word) <= MAX_KEYWORDS_TOTAL_CHARS
        if fits and len(kept) < MAX_KEYWORDS:
            kept.append(word)
            total += len(word)
        else:
            dropped.append(word)
    if dropped:
        logger.info(
            "listen: {} keyword(s) beyond our limits ({} terms, {} characters each, {} in all) "
            "not used: {}",
            len(dropped),
            MAX_KEYWORDS,
            MAX_KEYWORD_CHARS,
            MAX_KEYWORDS_TOTAL_CHARS,
            ", ".join(repr(w[:40]) for w in dropped[:10]) + (" ..." if len(dropped) > 10 else ""),
        )
    return kept


def language(raw: str | None) -> str | None:
    """BCP-47 (`en-US`) -> its language (`en`); `multi` or none: detect."""
    if not raw or raw.lower() == "multi":
        return None
    return raw.split("-")[0].lower()


def parse_query(query: QueryParams) -> ListenQuery:
    sniff = not query.get("encoding")
    raw_encoding = query.get("encoding") or "linear16"
    encoding = LISTEN_ENCODINGS.get(raw_encoding.lower())
    if encoding is None:
        raise QueryError(
            f"encoding {raw_encoding!r} is not supported here: send raw audio as linear16, "
            "mulaw or alaw (containers such as webm/opus are not streamed)."
        )
    default_rate = 16000 if encoding == "pcm_s16le" else 8000
    sample_rate = integer(query, "sample_rate", default_rate, *RATES)
    channels = integer(query, "channels", 1, 1, MAX_CHANNELS)
    endpointing: int | Literal[False] | None = None
    raw = (query.get("endpointing") or "").strip().lower()
    if raw == "false":
        endpointing = False
    elif raw and raw != "true":
        value = integer(query, "endpointing", 0, 0, 60_000)
        endpointing = min(max(value, ENDPOINTING_FLOOR_MS), ENDPOINTING_CEILING_MS)
    utterance_end = None
    if query.get("utterance_end_ms"):
        low, high = UTTERANCE_END_MS
        utterance_end = min(integer(query, "utterance_end_ms", 0, low, 10**9), high)
    return ListenQuery(
        encoding=encoding,
        sniff=sniff,
        sample_rate=sample_rate,
        channels=channels,
        multichannel=flag(query, "multichannel"),
        language=language(query.get("language")),
        keywords=terms(query),
        interim_results=flag(query, "interim_results"),
        endpointing=endpointing,
        utterance_end_ms=utterance_end,
        vad_events=flag(query, "vad_events"),
        diarize=flag(query, "diarize"),
    )


def listen_tokens(authorization: str | None, subprotocols: list[str]) -> list[str]:
    """The keys a client offers: `Authorization: Token <key>` or `Bearer <key>`, or, from a
    browser, the subprotocols `token, <key>`."""
    scheme, _, token = (authorization or "").partition(" ")
    tokens = [token.strip()] if scheme.lower() in ("token", "bearer") and token.strip() else []
    if len(subprotocols) >= 2 and subprotocols[0].lower() == "token":
        tokens += subprotocols[1:2]
    return tokens


@dataclass(frozen=True)
class FileQuery:
    """POST /v1/listen's query (pre-recorded): what it shares with the live one, plus
    `utterances` and `paragraphs`."""

    language: str | None = None
    keywords: list[str] = field(default_factory=list)
    multichannel: bool = False
    diarize: bool = False
    utterances: bool = False
    paragraphs: bool = False
    # raw audio's format (a body that is no container): None when `encoding` is not sent
    encoding: Encoding | None = None
    sample_rate: int = 16000
    channels: int = 1


def parse_file_query(query: QueryParams) -> FileQuery:
    # (another encoding, e.g. opus or flac, is its container's: the body is read as a file)
    encoding = LISTEN_ENCODINGS.get((query.get("encoding") or "").lower())
    default_rate = 16000 if encoding in (None, "pcm_s16le") else 8000
    return FileQuery(
        encoding=encoding,
        sample_rate=integer(query, "sample_rate", default_rate, *RATES),
        channels=integer(query, "channels", 1, 1, MAX_CHANNELS),
        language=language(query.get("language")),
        keywords=terms(query),
        multichannel=flag(query, "multichannel"),
        diarize=flag(query, "diarize"),
        utterances=flag(query, "utterances"),
        paragraphs=flag(query, "paragraphs"),
    )
