"""POST /v1/listen: Deepgram's pre-recorded transcription. The audio is the raw body, in any
format the upload routes decode (read within the same limits and budget: `api/uploads.py`);
word times are always asked for. A JSON body (`{"url": ...}`) is refused: this server does
not fetch URLs. Errors are Deepgram's shape (`err_code`, `err_msg`, `request_id`) with our
statuses (api/error_table.py)."""

from __future__ import annotations

import datetime
import hashlib
from tempfile import SpooledTemporaryFile
from typing import Any

from fastapi import APIRouter, Request, UploadFile
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers

from ...errors import BadRequestError, ServiceError
from ...logging import REQUEST_ID
from ...outputs.diarization import SpeakerTranscriber
from ...transcription.channels import channel_names, transcribe_channels
from ...transcription.service import Options
from ..deps import AppContext
from ..disconnect import unless_client_leaves
from ..error_table import http_status
from ..uploads import read_channels, read_upload
from .query import QueryError, parse_file_query
from .response import file_body
from .wire import model_identity

router = APIRouter()
SPOOL_BYTES = 1 << 20  # kept in memory up to this, then on disk (as multipart uploads)
ERR_CODES = {
    400: "Bad Request",
    401: "INVALID_AUTH",
    413: "PAYLOAD_TOO_LARGE",
    429: "TOO_MANY_REQUESTS",
}


def deepgram_error(status: int, message: str, retry_after: float | None = None) -> JSONResponse:
    body = {
        "err_code": ERR_CODES.get(status, "INTERNAL_SERVER_ERROR" if status >= 500 else "ERROR"),
        "err_msg": message,
        "request_id": REQUEST_ID.get(),
    }
    headers = {"Retry-After": str(int(retry_after))} if retry_after is not None else None
    return JSONResponse(body, status, headers)


async def body_file(request: Request) -> tuple[UploadFile, str]:
    """The raw body as an upload (spooled), and its sha256."""
    spool = SpooledTemporaryFile(max_size=SPOOL_BYTES)  # noqa: SIM115 (the upload owns it)
    sha, size = hashlib.sha256(), 0
    async for chunk in request.stream():
        spool.write(chunk)
        sha.update(chunk)
        size += len(chunk)
    spool.seek(0)
    if not size:
        spool.close()
        raise BadRequestError("Send the audio as the request body.", param="body")
    kind = request.headers.get("content-type") or "application/octet-stream"
    file: Any = spool  # (a binary file: what UploadFile reads)
    upload = UploadFile(file, size=size, headers=Headers({"content-type": kind}))
    return upload, sha.hexdigest()


# Not in the OpenAPI schema: its bodies are Deepgram's (docs/DEEPGRAM.md), not the errors there
@router.post("/v1/listen", include_in_schema=False)
async def listen_file(request: Request) -> JSONResponse:
    ctx: AppContext = request.app.state.ctx
    try:
        return await transcribe(ctx, request)
    except QueryError as exc:
        return deepgram_error(400, str(exc))
    except ServiceError as exc:
        return deepgram_error(http_status(exc), exc.message, exc.retry_after)


async def transcribe(ctx: AppContext, request: Request) -> JSONResponse:
    query = parse_file_query(request.query_params)
    kind = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
    if kind == "application/json":
        raise BadRequestError(
            "This server does not fetch audio from URLs: send the audio itself as the body "
            "(with its content type).",
            param="url",
        )
    decoding = ctx.transcriber.decoding(
        language=query.language,
        keywords=query.keywords or None,
        word_timestamps=True,
        segment_times=True,
    )
    options = Options(decoding)
    created = datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")
    upload, sha256 = await body_file(request)
    try:
        if query.multichannel:
            tracks = await read_channels(ctx, request, upload)
            names = channel_names(None, len(tracks))
            work = transcribe_channels(ctx.transcriber, tracks, options, names)
            channels, duration = len(tracks), tracks[0].duration
        else:
            audio = await read_upload(ctx, request, upload)
            if query.diarize:
                diarizer = SpeakerTranscriber(ctx.transcriber, ctx.settings.diarize_max_seconds)
                diarizer.check(audio)
                work = diarizer.transcribe(audio, options, [])
            else:
                work = ctx.transcriber.transcribe(audio, options)
            channels, duration = 1, audio.duration
        result = await unless_client_leaves(request, work)
    finally:
        await upload.close()
    engine = ctx.manager.engine
    model_uuid, info = model_identity(engine.model_id, engine.name)
    metadata: dict[str, Any] = {
        "transaction_key": "deprecated",
        "request_id": REQUEST_ID.get(),
        "sha256": sha256,
        "created": created.replace("+00:00", "Z"),
        "duration": round(duration, 3),
        "models": [model_uuid],
        "model_info": {model_uuid: info.model_dump()},
    }
    return JSONResponse(file_body(result, query, metadata, channels))
