"""What a client may ask of the decoder, checked in one place for every route and protocol:
language, candidate languages, prompt, keywords, temperature. The result is an audio-less
`TranscribeRequest` (each segment or utterance fills in its audio).

Errors are domain errors (`errors.py`); `api/` maps them to OpenAI's 400 bodies.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..engines.base import Engine, TranscribeRequest
from ..errors import BadRequestError
from ..text import parse_language

MAX_PROMPT_CHARS = 4000
MAX_KEYWORDS = 100  # keywords[] entries
MAX_KEYWORD_CHARS = 100  # one keyword or phrase
MAX_KEYWORDS_TOTAL_CHARS = 600  # all of them (whisper's hotwords share the prompt's 223 tokens)
MAX_LANGUAGES = 10  # languages[] candidates


def resolve_language(engine: Engine, value: str | None, param: str = "language") -> str | None:
    """User input -> ISO code the engine accepts, None for auto; 400 otherwise."""
    allowed = engine.languages
    try:
        code = parse_language(value)
    except ValueError:
        if allowed is None and value and re.fullmatch(r"[a-z]{2,3}", value.strip().lower()):
            return value.strip().lower()  # an engine that takes any code checks it itself
        raise BadRequestError(
            f"Unsupported language {value!r}. Use an ISO-639-1 code (en, zh, ...), a "
            "language name (English) or auto.",
            param=param,
            code="unsupported_language",
        ) from None
    if code is not None and allowed is not None and code not in allowed:
        raise BadRequestError(
            f"The {engine.name} model {engine.model_id!r} does not support language "
            f"{value!r}. Supported: {', '.join(sorted(allowed))}, or auto.",
            param=param,
            code="unsupported_language",
        )
    return code


def check_options(prompt: str | None, temperature: float | None) -> None:
    if prompt is not None and len(prompt) > MAX_PROMPT_CHARS:
        raise BadRequestError(
            f"prompt is longer than {MAX_PROMPT_CHARS} characters.", param="prompt"
        )
    if temperature is not None and not 0.0 <= temperature <= 1.0:
        raise BadRequestError("temperature must be between 0 and 1.", param="temperature")


def check_keywords(values: Iterable[str] | None) -> tuple[str, ...]:
    """Blank entries dropped, duplicates kept once, in order; 400 beyond the limits. Linear
    in the input (it runs on the event loop): dict lookups, and it stops at the first entry
    past the limit."""
    out: dict[str, None] = {}
    for value in values or ():
        word = " ".join(value.split())
        if word:
            out[word] = None
        if len(out) > MAX_KEYWORDS:
            raise BadRequestError(f"At most {MAX_KEYWORDS} keywords (got more).", param="keywords")
    long = next((w for w in out if len(w) > MAX_KEYWORD_CHARS), None)
    if long is not None:
        raise BadRequestError(
            f"A keyword is longer than {MAX_KEYWORD_CHARS} characters: {long[:40]!r}...",
            param="keywords",
        )
    if sum(len(w) for w in out) > MAX_KEYWORDS_TOTAL_CHARS:
        raise BadRequestError(
            f"The keywords are longer than {MAX_KEYWORDS_TOTAL_CHARS} characters together.",
            param="keywords",
        )
    return tuple(out)


def resolve_languages(engine: Engine, values: Iterable[str] | None) -> tuple[str, ...]:
    """Candidate languages -> ISO codes the engine accepts, deduplicated in order; `auto`
    among them means no restriction (an empty tuple)."""
    out: list[str] = []
    raw = [v for v in values or () if v.strip()]
    if len(raw) > MAX_LANGUAGES:
        raise BadRequestError(
            f"At most {MAX_LANGUAGES} candidate languages (got {len(raw)}).", param="languages"
        )
    for value in raw:
        code = resolve_language(engine, value, param="languages")
        if code is None:
            return ()
        if code not in out:
            out.append(code)
    return tuple(out)


def build_decoding(
    engine: Engine,
    *,
    language: str | None = None,
    languages: Iterable[str] | None = None,
    prompt: str | None = None,
    keywords: Iterable[str] | None = None,
    temperature: float | None = None,
    logprobs: bool = False,
    word_timestamps: bool = False,
    segment_times: bool = True,
) -> TranscribeRequest:
    """The checked request (400 on any bad field). A forced `language` wins over candidate
    `languages`; exactly one candidate is the same as `language`."""
    code = resolve_language(engine, language)
    candidates = resolve_languages(engine, languages)
    check_options(prompt, temperature)
    if code is None and len(candidates) == 1:
        code = candidates[0]
    return TranscribeRequest(
        language=code,
        languages=() if code is not None else candidates,
        prompt=prompt or None,
        keywords=check_keywords(keywords),
        temperature=temperature,
        logprobs=logprobs,
        word_timestamps=word_timestamps,
        segment_times=segment_times,
    )
