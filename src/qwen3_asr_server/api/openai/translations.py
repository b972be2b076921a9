"""POST /v1/audio/translations: transcribe, then translate with an OpenAI-compatible LLM.

OpenAI's semantics by default (into English); the seed's `language` sets the target.
Subtitles keep their cue count, indices and timing: the cue texts are translated, not the file.
"""

from __future__ import annotations

import math
from typing import Annotated

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from ...errors import BadRequestError
from ...outputs.formats import language_label
from ...outputs.subtitles import build_cues, cue_rules, cue_segments, join_words, wrap
from ...outputs.translate import target_name
from ...text import language_name, parse_language, split_words
from ..deps import AppContext, get_ctx, require_api_key
from ..disconnect import unless_client_leaves
from ..uploads import read_upload
from .forms import TranslationForm
from .subtitles import subtitle_response

router = APIRouter(dependencies=[Depends(require_api_key)])


def resolve_target(value: str | None) -> str:
    try:
        code = parse_language(value or "en")
    except ValueError:
        code = None
    if code is None:
        raise BadRequestError(
            f"Unsupported target language {value!r}; use an ISO-639-1 code such as en or zh.",
            param="language",
            code="unsupported_language",
        )
    return code


@router.post("/v1/audio/translations")
async def create_translation(
    form: Annotated[TranslationForm, Form()],
    ctx: Annotated[AppContext, Depends(get_ctx)],
    request: Request,
) -> Response:
    ctx.translator.require()
    code = resolve_target(form.language)
    target = target_name(code, language_name(code))
    options = form.to_options(ctx.transcriber)
    audio = await read_upload(ctx, request, form.file)
    result = await unless_client_leaves(request, ctx.transcriber.transcribe(audio, options))
    response_format = form.response_format
    if response_format in ("srt", "vtt"):
        rules = cue_rules(ctx.settings, form.max_line_chars)
        cues = build_cues(result.segments, rules, result.duration)
        lines = [" ".join(c.lines) for c in cues]
        texts = await unless_client_leaves(request, ctx.translator.lines(lines, target))
        for cue, text in zip(cues, texts, strict=True):
            words = split_words(text)
            cue.lines = wrap(words, rules.max_line_chars, rules.max_lines) or [join_words(words)]
        return subtitle_response(cue_segments(cues), response_format, "translated_subtitles")
    translated = await unless_client_leaves(request, ctx.translator.text(result.text, target))
    if response_format == "text":
        return PlainTextResponse(translated)
    return JSONResponse(
        {
            "text": translated,
            "language": language_label(code),
            "source_language": language_label(result.language),
            "duration": round(result.duration, 3),
            "usage": {"type": "duration", "seconds": math.ceil(result.duration)},
        }
    )
