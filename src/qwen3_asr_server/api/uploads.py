"""Reading an uploaded file: bounded, within the decoded-audio budget, decoded off the event
loop. Every upload route reads its file here."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, UploadFile

from ..audio.budget import Reservation
from ..audio.channels import check_channels, decode_channels
from ..audio.decode import Audio, check_duration, decode_audio, is_raw_pcm, probe_seconds
from ..errors import TooLargeError
from ..outputs.diarization import SpeakerTranscriber
from ..transcript import Transcript
from ..transcription.service import Options
from .deps import AppContext
from .middleware import on_request_end


async def read_upload(ctx: AppContext, request: Request, file: UploadFile) -> Audio:
    """Read (bounded) and decode an uploaded file off the event loop, within the
    decoded-audio budget (MAX_PENDING_AUDIO_SECONDS), held until the request ends.

    A full queue or a spent budget refuses the upload first: decoding a file that cannot be
    queued would spend CPU and memory on work that is thrown away. The duration is taken
    from the container's header before decoding, and the reservation grows with the
    decoded audio, block by block: a header that lies (or says nothing) is refused at the
    first block past the budget."""
    reserve = await _admitted(ctx, request, file)
    return await asyncio.to_thread(
        decode_audio,
        file.file,  # the spooled file (on disk past 1 MB), not a bytes copy held in memory
        content_type=file.content_type,
        filename=file.filename,
        max_seconds=ctx.settings.max_audio_seconds,
        reserve=reserve,  # on the decoding thread (the budget is thread-safe)
    )


async def read_channels(ctx: AppContext, request: Request, file: UploadFile) -> list[Audio]:
    """As `read_upload`, each channel its own track (multichannel=true); the budget holds
    them all (a stereo file reserves twice its duration)."""
    if is_raw_pcm(file.content_type, file.filename):
        check_channels(1)  # raw PCM uploads are mono
    reserve = await _admitted(ctx, request, file, tracks=2)
    return await asyncio.to_thread(
        decode_channels, file.file, max_seconds=ctx.settings.max_audio_seconds, reserve=reserve
    )


async def _admitted(
    ctx: AppContext, request: Request, file: UploadFile, tracks: int = 1
) -> Callable[[float], None]:
    """Admission (MAX_QUEUE, once; the upload's segments are then admitted), the budget's
    room, the size limit and the header's duration: the reservation's `grow_to`."""
    on_request_end(request.scope, ctx.scheduler.admit().release)
    ctx.budget.check_room()
    limit = ctx.settings.max_upload_bytes
    if (file.size or 0) > limit:  # the body limit middleware already cut bigger bodies
        raise TooLargeError(
            f"The file is larger than the {ctx.settings.max_upload_mb:g} MB limit (MAX_UPLOAD_MB).",
            param="file",
        )
    kind = {"content_type": file.content_type, "filename": file.filename}
    estimate = await asyncio.to_thread(probe_seconds, file.file, **kind)
    check_duration(estimate or 0.0, ctx.settings.max_audio_seconds)  # 413, not a 503 to retry
    reservation = ctx.budget.reserve(tracks * (estimate or 0.0))
    on_request_end(request.scope, reservation.release)
    return reservation.grow_to


def held_until_the_end(ctx: AppContext, request: Request) -> Reservation:
    """A share of the decoded-audio budget, empty for now, given back when the request ends
    (known speakers' reference clips grow it as they are decoded)."""
    reservation = ctx.budget.reserve(0.0)
    on_request_end(request.scope, reservation.release)
    return reservation


def transcription(
    ctx: AppContext, audio: Audio, options: Options, diarize: bool
) -> Coroutine[Any, Any, Transcript]:
    """An upload's transcription, with speakers (checked against DIARIZE_MAX_SECONDS first)
    when `diarize`: the work for `unless_client_leaves`."""
    if not diarize:
        return ctx.transcriber.transcribe(audio, options)
    speakers = SpeakerTranscriber(ctx.transcriber, ctx.settings.diarize_max_seconds)
    speakers.check(audio)
    return speakers.transcribe(audio, options, [])
