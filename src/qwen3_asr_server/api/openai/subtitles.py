"""POST /v1/audio/subtitles: the seed's subtitle endpoint (SRT by default, VTT on request)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import PlainTextResponse, Response

from ...errors import BadRequestError
from ...outputs.formats import to_srt, to_vtt
from ...outputs.subtitles import build_cues, cue_rules, cue_segments
from ...transcript import Segment
from ..deps import AppContext, get_ctx, require_api_key
from ..disconnect import unless_client_leaves
from ..uploads import read_upload, transcription
from .forms import SubtitleForm

router = APIRouter(dependencies=[Depends(require_api_key)])


def check_accurate(ctx: AppContext) -> None:
    engine = ctx.manager.engine
    if engine.word_timestamps == "estimate":
        raise BadRequestError(
            "mode=accurate needs word timestamps from a forced aligner, and none is configured "
            f"for the {engine.name} engine. Set FORCED_ALIGNER_ID=Qwen/Qwen3-ForcedAligner-0.6B "
            "(or a local copy of it) and restart, or use mode=fast.",
            param="mode",
            code="aligner_unavailable",
        )


@router.post("/v1/audio/subtitles")
async def create_subtitles(
    form: Annotated[SubtitleForm, Form()],
    ctx: Annotated[AppContext, Depends(get_ctx)],
    request: Request,
) -> Response:
    """fast: each segment's time spread over its words by length. accurate: word times from
    the forced aligner (Qwen) or the engine's own (whisper)."""
    options = form.to_options(ctx.transcriber)
    if form.mode == "accurate":
        check_accurate(ctx)
    audio = await read_upload(ctx, request, form.file)
    result = await unless_client_leaves(request, transcription(ctx, audio, options, form.diarize))
    rules = cue_rules(ctx.settings, form.max_line_chars)
    cues = build_cues(result.segments, rules, result.duration)
    segments = cue_segments(cues)
    return subtitle_response(segments, form.response_format, "subtitles")


def subtitle_response(segments: list[Segment], response_format: str, name: str) -> Response:
    """An SRT/VTT body sent as a download, as the seed did (`subtitles.srt`)."""
    headers = {"Content-Disposition": f'attachment; filename="{name}.{response_format}"'}
    if response_format == "vtt":
        return PlainTextResponse(to_vtt(segments), media_type="text/vtt", headers=headers)
    return PlainTextResponse(to_srt(segments), headers=headers)
