"""POST /v1/audio/transcriptions (OpenAI form fields) and the seed's SSE
/v1/audio/transcriptions/stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from loguru import logger

from ..audio import Audio, check_duration, decode_audio, probe_seconds
from ..engines.base import ModelLoadError
from ..errors import BadRequestError, TooLargeError
from ..formats import (
    json_body,
    seed_language,
    to_srt,
    to_vtt,
    verbose_json_body,
    words_body,
)
from ..long_form import overall_language
from ..service import Options
from ..text import join_texts
from ..transcript import Transcript
from ..vad import fill_no_speech_probs
from .deps import AppContext, get_ctx, require_api_key
from .disconnect import unless_client_leaves
from .middleware import on_request_end
from .sse import sse_response

router = APIRouter(dependencies=[Depends(require_api_key)])

ResponseFormat = Literal["json", "text", "srt", "vtt", "verbose_json"]
GRANULARITIES = {"word", "segment"}


async def read_upload(ctx: AppContext, request: Request, file: UploadFile) -> Audio:
    """Read (bounded) and decode an uploaded file off the event loop, within the
    decoded-audio budget (MAX_PENDING_AUDIO_SECONDS), held until the request ends.

    A full queue or a spent budget refuses the upload first: decoding a file that cannot be
    queued would spend CPU and memory on work that is thrown away. The duration is taken
    from the container's header before decoding, and the reservation grows with the
    decoded audio, block by block: a header that lies (or says nothing) is refused at the
    first block past the budget."""
    # MAX_QUEUE is checked here, once; the upload's segments are then admitted
    on_request_end(request.scope, ctx.scheduler.admit().release)
    ctx.budget.check_room()
    limit = ctx.settings.max_upload_bytes
    if (file.size or 0) > limit:  # the body limit middleware already cut bigger bodies
        raise TooLargeError(
            f"The file is larger than the {ctx.settings.max_upload_mb:g} MB limit (MAX_UPLOAD_MB).",
            param="file",
        )
    # Read from the spooled file (on disk past 1 MB), not a bytes copy held in memory.
    kind = {"content_type": file.content_type, "filename": file.filename}
    estimate = await asyncio.to_thread(probe_seconds, file.file, **kind)
    check_duration(estimate or 0.0, ctx.settings.max_audio_seconds)  # 413, not a 503 to retry
    reservation = ctx.budget.reserve(estimate or 0.0)
    on_request_end(request.scope, reservation.release)
    return await asyncio.to_thread(
        decode_audio,
        file.file,
        **kind,
        max_seconds=ctx.settings.max_audio_seconds,
        reserve=reservation.grow_to,  # on the decoding thread (the budget is thread-safe)
    )


def server_timing(result: Transcript, decode_seconds: float) -> str:
    """`Server-Timing` header: where the request's time went, in milliseconds."""
    queue = max(0.0, result.job_seconds - result.engine_seconds)
    parts = [("decode", decode_seconds), ("queue", queue), ("engine", result.engine_seconds)]
    return ", ".join(f"{name};dur={seconds * 1000:.1f}" for name, seconds in parts)


def format_response(
    result: Transcript, response_format: str, options: Options, headers: dict[str, str]
) -> Response:
    if response_format == "text":
        return PlainTextResponse(result.text, headers=headers)
    if response_format == "srt":
        return PlainTextResponse(to_srt(result.segments), headers=headers)
    if response_format == "vtt":
        return PlainTextResponse(to_vtt(result.segments), media_type="text/vtt", headers=headers)
    if response_format == "verbose_json":
        body = verbose_json_body(
            result, words=options.word_timestamps, temperature=options.temperature
        )
        return JSONResponse(body, headers=headers)
    body = json_body(result)
    if options.word_timestamps:  # the seed's return_timestamps=true
        body["words"] = words_body(result.segments)
    return JSONResponse(body, headers=headers)


def parse_granularities(values: list[str] | None) -> set[str]:
    chosen = {v.strip() for v in values or [] if v.strip()}
    unknown = chosen - GRANULARITIES
    if unknown:
        raise BadRequestError(
            f"Unknown timestamp granularity {sorted(unknown)[0]!r}; use word or segment.",
            param="timestamp_granularities",
        )
    return chosen


async def openai_events(
    ctx: AppContext, audio: Audio, options: Options
) -> AsyncIterator[dict[str, Any]]:
    full = ""
    async for part in ctx.transcriber.stream(audio, options):
        joined = join_texts([full, part.text])
        if joined != full:  # the delta carries its leading space, so deltas concatenate
            yield {"type": "transcript.text.delta", "delta": joined[len(full) :]}
            full = joined
    yield {"type": "transcript.text.done", "text": full}


async def seed_events(
    ctx: AppContext, audio: Audio, options: Options
) -> AsyncIterator[dict[str, Any]]:
    """The seed's fields (`text`, `language` as `English`, `is_final` on the last chunk,
    `chunk_index`; `done: true` last) plus ours (`type`, `index`, `start`, `end`)."""
    parts = []
    async for part in ctx.transcriber.stream(audio, options):
        parts.append(part)
        chunk: dict[str, Any] = {
            "type": "segment",
            "index": part.index,
            "chunk_index": part.index,
            "start": round(part.span.start_s, 3),
            "end": round(part.span.end_s, 3),
            "text": part.text,
            "language": seed_language(part.language or options.language),
            "is_final": part.span.end >= len(audio.samples),
        }
        if options.word_timestamps:  # the seed's return_timestamps=true
            chunk["words"] = words_body(part.segments)
        yield chunk
    yield {
        "type": "done",
        "done": True,
        "is_final": True,
        "text": join_texts([p.text for p in parts]),
        "language": seed_language(overall_language(parts, options.language)),
        "duration": round(audio.duration, 3),
        "segments": len(parts),
    }


@router.post("/v1/audio/transcriptions")
async def create_transcription(
    file: Annotated[UploadFile, File(description="The audio file to transcribe.")],
    ctx: Annotated[AppContext, Depends(get_ctx)],
    request: Request,
    model: Annotated[str | None, Form()] = None,
    language: Annotated[str | None, Form()] = None,
    prompt: Annotated[str | None, Form()] = None,
    response_format: Annotated[ResponseFormat, Form()] = "json",
    temperature: Annotated[float | None, Form()] = None,
    timestamp_granularities: Annotated[
        list[str] | None, Form(alias="timestamp_granularities[]")
    ] = None,
    stream: Annotated[bool, Form()] = False,
    return_timestamps: Annotated[bool, Form()] = False,
) -> Response:
    """`model` is accepted for compatibility; the server always uses the model it serves."""
    service = ctx.transcriber
    code = service.resolve_language(language)
    service.check_options(prompt, temperature)
    granularities = parse_granularities(timestamp_granularities)
    if stream and response_format not in ("json", "text"):
        # As OpenAI does for formats that cannot stream: the normal body (LiteLLM sends
        # stream=true with verbose_json).
        logger.debug("stream=true ignored for response_format={}", response_format)
        stream = False
    words = return_timestamps or ("word" in granularities and response_format == "verbose_json")
    text_only = response_format in ("json", "text") and not words
    options = Options(code, prompt, temperature, words, segment_times=not text_only)
    started = time.perf_counter()
    audio = await read_upload(ctx, request, file)
    decode_seconds = time.perf_counter() - started
    if stream:
        options = replace(options, max_seconds=ctx.settings.sse_chunk_seconds)
        return sse_response(openai_events(ctx, audio, options))
    result = await unless_client_leaves(request, service.transcribe(audio, options))
    if response_format == "verbose_json":  # OpenAI's schema wants a number for every segment
        try:
            await asyncio.to_thread(fill_no_speech_probs, ctx.vad, audio.samples, result.segments)
        except ModelLoadError as exc:  # no Silero VAD installed: the documented 0.0 stays
            logger.debug("no_speech_prob without a VAD: {}", exc)
    headers = {"Server-Timing": server_timing(result, decode_seconds)}
    return format_response(result, response_format, options, headers)


@router.post("/v1/audio/transcriptions/stream")
async def stream_transcription(
    file: Annotated[UploadFile, File(description="The audio file to transcribe.")],
    ctx: Annotated[AppContext, Depends(get_ctx)],
    request: Request,
    model: Annotated[str | None, Form()] = None,
    language: Annotated[str | None, Form()] = None,
    prompt: Annotated[str | None, Form()] = None,
    temperature: Annotated[float | None, Form()] = None,
    return_timestamps: Annotated[bool, Form()] = False,
) -> Response:
    """The seed's SSE endpoint: one `segment` event per finished segment, then `done`."""
    code = ctx.transcriber.resolve_language(language)
    ctx.transcriber.check_options(prompt, temperature)
    audio = await read_upload(ctx, request, file)
    options = Options(
        code,
        prompt,
        temperature,
        word_timestamps=return_timestamps,
        max_seconds=ctx.settings.sse_chunk_seconds,
    )
    return sse_response(seed_events(ctx, audio, options))
