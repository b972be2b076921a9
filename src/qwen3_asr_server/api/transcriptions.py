"""POST /v1/audio/transcriptions (OpenAI form fields)."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, File, Form, UploadFile
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from ..audio import Audio, decode_audio
from ..errors import TooLargeError
from ..service import Transcription
from ..text import language_name
from .deps import AppContext, get_ctx, require_api_key

router = APIRouter(dependencies=[Depends(require_api_key)])

ResponseFormat = Literal["json", "text"]


async def read_upload(ctx: AppContext, file: UploadFile) -> Audio:
    """Read (bounded) and decode an uploaded file off the event loop."""
    limit = ctx.settings.max_upload_bytes
    data = await file.read(limit + 1)
    if len(data) > limit:
        raise TooLargeError(
            f"The file is larger than the {ctx.settings.max_upload_mb:g} MB limit (MAX_UPLOAD_MB).",
            param="file",
        )
    return await asyncio.to_thread(
        decode_audio,
        data,
        content_type=file.content_type,
        filename=file.filename,
        max_seconds=ctx.settings.max_audio_seconds,
    )


def json_body(result: Transcription) -> dict[str, Any]:
    name = language_name(result.language)
    return {
        "text": result.text,
        "language": (name or result.language or "").lower() or None,
        "duration": round(result.duration, 3),
        "usage": {"type": "duration", "seconds": math.ceil(result.duration)},
    }


def server_timing(result: Transcription, decode_seconds: float) -> str:
    """`Server-Timing` header: where the request's time went, in milliseconds."""
    queue = max(0.0, result.job_seconds - result.engine_seconds)
    parts = [("decode", decode_seconds), ("queue", queue), ("engine", result.engine_seconds)]
    return ", ".join(f"{name};dur={seconds * 1000:.1f}" for name, seconds in parts)


def format_response(result: Transcription, response_format: str, timing: str) -> Response:
    headers = {"Server-Timing": timing}
    if response_format == "text":
        return PlainTextResponse(result.text, headers=headers)
    return JSONResponse(json_body(result), headers=headers)


@router.post("/v1/audio/transcriptions")
async def create_transcription(
    file: Annotated[UploadFile, File(description="The audio file to transcribe.")],
    ctx: Annotated[AppContext, Depends(get_ctx)],
    model: Annotated[str | None, Form()] = None,
    language: Annotated[str | None, Form()] = None,
    prompt: Annotated[str | None, Form()] = None,
    response_format: Annotated[ResponseFormat, Form()] = "json",
    temperature: Annotated[float | None, Form()] = None,
) -> Response:
    """`model` is accepted for compatibility; the server always uses the model it serves."""
    service = ctx.transcriber
    code = service.resolve_language(language)
    service.check_options(prompt, temperature)
    started = time.perf_counter()
    audio = await read_upload(ctx, file)
    decode_seconds = time.perf_counter() - started
    result = await service.transcribe(audio, language=code, prompt=prompt, temperature=temperature)
    return format_response(result, response_format, server_timing(result, decode_seconds))
