"""POST /v1/audio/subtitles: the seed's subtitle endpoint (SRT by default, VTT on request)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, File, Form, Request, UploadFile
from fastapi.responses import PlainTextResponse, Response

from ..errors import BadRequestError
from ..formats import to_srt, to_vtt
from ..service import Options
from ..subtitles import build_cues, cue_rules, cue_segments
from ..transcript import Segment
from .deps import AppContext, get_ctx, require_api_key
from .disconnect import unless_client_leaves
from .transcriptions import read_upload

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
    file: Annotated[UploadFile, File(description="The audio file to subtitle.")],
    ctx: Annotated[AppContext, Depends(get_ctx)],
    request: Request,
    model: Annotated[str | None, Form()] = None,
    language: Annotated[str | None, Form()] = None,
    prompt: Annotated[str | None, Form()] = None,
    mode: Annotated[Literal["fast", "accurate"], Form()] = "fast",
    max_line_chars: Annotated[int, Form(ge=10, le=200)] = 42,
    response_format: Annotated[Literal["srt", "vtt"], Form()] = "srt",
) -> Response:
    """fast: each segment's time spread over its words by length. accurate: word times from
    the forced aligner (Qwen) or the engine's own (whisper)."""
    code = ctx.transcriber.resolve_language(language)
    ctx.transcriber.check_options(prompt, None)
    if mode == "accurate":
        check_accurate(ctx)
    audio = await read_upload(ctx, request, file)
    options = Options(code, prompt, None, word_timestamps=mode == "accurate")
    result = await unless_client_leaves(request, ctx.transcriber.transcribe(audio, options))
    cues = build_cues(result.segments, cue_rules(ctx.settings, max_line_chars))
    segments = cue_segments(cues)
    return subtitle_response(segments, response_format, "subtitles")


def subtitle_response(segments: list[Segment], response_format: str, name: str) -> Response:
    """An SRT/VTT body sent as a download, as the seed did (`subtitles.srt`)."""
    headers = {"Content-Disposition": f'attachment; filename="{name}.{response_format}"'}
    if response_format == "vtt":
        return PlainTextResponse(to_vtt(segments), media_type="text/vtt", headers=headers)
    return PlainTextResponse(to_srt(segments), headers=headers)
