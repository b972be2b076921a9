"""POST /v1/audio/transcriptions (OpenAI form fields) and the seed's SSE
/v1/audio/transcriptions/stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import Response
from loguru import logger

from ...audio.decode import Audio
from ...audio.pcm import SAMPLE_RATE
from ...audio.vad import fill_no_speech_probs
from ...errors import ModelLoadError
from ...outputs.diarization import KnownSpeaker, SpeakerTranscriber, known_speakers
from ...outputs.formats import (
    diarized_segment_body,
    done_usage,
    languages_body,
    logprobs_body,
    render,
    seed_language,
    words_body,
)
from ...text import join_texts
from ...transcript import Segment, Transcript
from ...transcription.channels import channel_names, stream_channels, transcribe_channels
from ...transcription.long_form import (
    merged_logprobs,
    merged_usage,
    overall_language,
    spoken_languages,
)
from ...transcription.service import Options
from ..deps import AppContext, get_ctx, require_api_key
from ..disconnect import unless_client_leaves
from ..uploads import held_until_the_end, read_channels, read_upload
from .forms import SeedStreamForm, TranscriptionForm
from .sse import sse_response

router = APIRouter(dependencies=[Depends(require_api_key)])


def server_timing(result: Transcript, decode_seconds: float) -> str:
    """`Server-Timing` header: where the request's time went, in milliseconds."""
    queue = max(0.0, result.job_seconds - result.engine_seconds)
    parts = [("decode", decode_seconds), ("queue", queue), ("engine", result.engine_seconds)]
    return ", ".join(f"{name};dur={seconds * 1000:.1f}" for name, seconds in parts)


def format_response(
    result: Transcript, form: TranscriptionForm, options: Options, headers: dict[str, str]
) -> Response:
    body, media_type = render(result, form.response_format, form.body_wishes(options))
    return Response(body, media_type=media_type, headers=headers)


async def openai_events(
    ctx: AppContext, audio: Audio, options: Options
) -> AsyncIterator[dict[str, Any]]:
    """OpenAI's `transcript.text.delta` per segment, then `transcript.text.done` with the
    whole text, the detected `languages`, the token `usage` (`done_usage`: the SDK's done
    event has no duration usage) and `logprobs` when asked for."""
    full = ""
    parts = []
    wants_logprobs = options.request.logprobs
    async for part in ctx.transcriber.stream(audio, options):
        parts.append(part)
        joined = join_texts([full, part.text])
        if joined != full:  # the delta carries its leading space, so deltas concatenate
            delta: dict[str, Any] = {"type": "transcript.text.delta", "delta": joined[len(full) :]}
            if wants_logprobs:
                delta["logprobs"] = logprobs_body(part.logprobs)
            yield delta
            full = joined
    done: dict[str, Any] = {
        "type": "transcript.text.done",
        "text": full,
        "languages": languages_body(spoken_languages(parts)),
    }
    segments = [s for p in parts for s in p.segments]
    usage = done_usage(merged_usage(parts), segments, len(audio.samples) / SAMPLE_RATE)
    if usage is not None:
        done["usage"] = usage
    if wants_logprobs:
        done["logprobs"] = logprobs_body(merged_logprobs(parts))
    yield done


async def speaker_events(
    diarizer: SpeakerTranscriber, audio: Audio, options: Options, known: list[KnownSpeaker]
) -> AsyncIterator[dict[str, Any]]:
    """OpenAI's diarized stream: a `transcript.text.segment` as each speaker turn is final,
    in order, then `transcript.text.done`."""
    index = 0
    async for segments, whole in diarizer.stream(audio, options, known):
        for segment in segments:
            yield diarized_segment_body(index, segment)
            index += 1
        if whole is not None:
            done: dict[str, Any] = {"type": "transcript.text.done", "text": whole.text}
            done["languages"] = languages_body(whole.languages)
            usage = done_usage(whole.usage, whole.segments, whole.duration)
            if usage is not None:
                done["usage"] = usage
            yield done


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
            "language": seed_language(part.language or options.request.language),
            "is_final": part.span.end >= len(audio.samples),
        }
        if options.request.word_timestamps:  # the seed's return_timestamps=true
            chunk["words"] = words_body(part.segments)
        yield chunk
    yield {
        "type": "done",
        "done": True,
        "is_final": True,
        "text": join_texts([p.text for p in parts]),
        "language": seed_language(overall_language(parts, options.request.language)),
        "duration": round(audio.duration, 3),
        "segments": len(parts),
    }


@router.post("/v1/audio/transcriptions")
async def create_transcription(
    form: Annotated[TranscriptionForm, Form()],
    ctx: Annotated[AppContext, Depends(get_ctx)],
    request: Request,
) -> Response:
    """`model` is accepted for compatibility; the server always uses the model it serves."""
    options = form.to_options(ctx.transcriber)
    if form.stream and not form.streams():
        logger.debug("stream=true ignored for response_format={}", form.response_format)
    if form.channels():
        return await multichannel(ctx, request, form, options)
    speakers = form.diarizes()
    known = await asyncio.to_thread(
        known_speakers,
        form.known_speaker_names,
        form.known_speaker_references,
        held_until_the_end(ctx, request),
    )
    started = time.perf_counter()
    audio = await read_upload(ctx, request, form.file)
    decode_seconds = time.perf_counter() - started
    diarizer = SpeakerTranscriber(ctx.transcriber, ctx.settings.diarize_max_seconds)
    if speakers:
        diarizer.check(audio)
    if form.streams():
        options = replace(options, max_seconds=ctx.settings.sse_chunk_seconds)
        if speakers:
            return sse_response(speaker_events(diarizer, audio, options, known))
        return sse_response(openai_events(ctx, audio, options))
    if speakers:
        work = diarizer.transcribe(audio, options, known)
    else:
        work = ctx.transcriber.transcribe(audio, options)
    result = await unless_client_leaves(request, work)
    if form.response_format == "verbose_json":  # OpenAI's schema wants a number per segment
        try:
            await asyncio.to_thread(fill_no_speech_probs, ctx.vad, audio.samples, result.segments)
        except ModelLoadError as exc:  # no Silero VAD installed: the documented 0.0 stays
            logger.debug("no_speech_prob without a VAD: {}", exc)
    # X-Model-ID, the model that answered, is added to every /v1/audio/ answer (middleware)
    headers = {"Server-Timing": server_timing(result, decode_seconds)}
    return format_response(result, form, options, headers)


@router.post("/v1/audio/transcriptions/stream")
async def stream_transcription(
    form: Annotated[SeedStreamForm, Form()],
    ctx: Annotated[AppContext, Depends(get_ctx)],
    request: Request,
) -> Response:
    """The seed's SSE endpoint: one `segment` event per finished segment, then `done`."""
    options = form.to_options(ctx.transcriber)
    audio = await read_upload(ctx, request, form.file)
    options = replace(options, max_seconds=ctx.settings.sse_chunk_seconds)
    return sse_response(seed_events(ctx, audio, options))


async def multichannel(
    ctx: AppContext, request: Request, form: TranscriptionForm, options: Options
) -> Response:
    """multichannel=true: each channel on its own, merged by time (docs/CALLS.md)."""
    started = time.perf_counter()
    tracks = await read_channels(ctx, request, form.file)
    decode_seconds = time.perf_counter() - started
    names = channel_names(form.channel_names, len(tracks))
    # the merge orders by time: every format decodes with segment times, json and text too
    timed = replace(options, request=replace(options.request, segment_times=True))
    if form.streams():  # each segment in time order, as soon as it is final
        events = stream_channels(ctx.transcriber, tracks, timed, names)
        return sse_response(channel_events(events, form.response_format == "diarized_json"))
    work = transcribe_channels(ctx.transcriber, tracks, timed, names)
    result = await unless_client_leaves(request, work)
    headers = {"Server-Timing": server_timing(result, decode_seconds)}
    return format_response(result, form, options, headers)


async def channel_events(
    items: AsyncIterator[Segment | Transcript], diarized: bool
) -> AsyncIterator[dict[str, Any]]:
    """A multichannel stream: a segment event per segment (diarized_json: OpenAI's
    `transcript.text.segment` with the channel's name as speaker; otherwise a text delta
    with its `channel`), in time order, then `transcript.text.done` (the merged call)."""
    full, index = "", 0
    async for item in items:
        if isinstance(item, Transcript):
            yield done_event(item)
            return
        if diarized:
            yield diarized_segment_body(index, item)
            index += 1
            continue
        joined = join_texts([full, item.text])
        yield {
            "type": "transcript.text.delta",
            "delta": joined[len(full) :],
            "channel": item.channel,
        }
        full = joined


def done_event(result: Transcript) -> dict[str, Any]:
    done: dict[str, Any] = {"type": "transcript.text.done", "text": result.text}
    done["languages"] = languages_body(result.languages)
    usage = done_usage(result.usage, result.segments, result.duration)
    if usage is not None:
        done["usage"] = usage
    return done
