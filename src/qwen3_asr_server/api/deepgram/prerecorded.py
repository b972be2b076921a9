"""POST /v1/listen: Deepgram's pre-recorded transcription. The audio is the raw body, in any
format the upload routes decode (read within the same limits and budget: `api/uploads.py`);
word times are always asked for. A JSON body (`{"url": ...}`) is refused unless
LISTEN_URL_HOSTS lists hosts to fetch from: then the URL's content, fetched and guarded by
`fetch.py`, takes the raw body's path: admitted first (MAX_QUEUE, the audio budget), then
fetched in one of the app's few fetch slots, stopped if the client leaves. The audio is
spooled and hashed off the event loop, in batches. Errors are Deepgram's shape
(`refusals.py`) with our statuses (api/error_table.py); a URL the server could not fetch
(502) is Deepgram's `REMOTE_CONTENT_ERROR`."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
from tempfile import SpooledTemporaryFile
from typing import Any

from fastapi import APIRouter, Request, UploadFile
from fastapi.responses import JSONResponse
from loguru import logger
from starlette.datastructures import Headers

from ...audio.decode import Audio
from ...errors import BadRequestError, ServiceError
from ...logging import REQUEST_ID, redact_url
from ...transcript import Transcript
from ...transcription.channels import channel_names, merge_channels, transcribe_channels
from ...transcription.service import Options
from ..deps import AppContext
from ..disconnect import unless_client_leaves
from ..error_table import http_status
from ..middleware import on_request_end
from ..uploads import read_channels, read_upload, transcription
from . import messages as m
from .containers import compressed, is_wav, wav_for_raw
from .fetch import UrlFetcher
from .query import FileQuery, QueryError, parse_file_query
from .refusals import LISTEN_PATH, TOO_MANY_REQUESTS, error_body
from .response import created_now, file_body
from .wire import model_identity

router = APIRouter()
SPOOL_BYTES = 1 << 20  # kept in memory up to this, then on disk (as multipart uploads)
BATCH_BYTES = 1 << 20  # written and hashed off the event loop this much at a time
MAX_JSON_BYTES = 16384  # a JSON body: {"url": ...}
# full: MAX_QUEUE, the fetch slots, the decoded-audio budget (503 on our other routes)
OVERLOAD = frozenset({"queue_full", "fetches_full", "audio_budget_full"})


def deepgram_error(
    status: int, message: str, retry_after: float | None = None, code: str | None = None
) -> JSONResponse:
    headers = {"Retry-After": str(int(retry_after))} if retry_after is not None else None
    return JSONResponse(error_body(status, message, code), status, headers)


class Spool:
    """The audio (the raw body, or a URL's content) as it comes, spooled, and its sha256:
    gathered into batches, each written and hashed on a thread, in order."""

    def __init__(self) -> None:
        self.file = SpooledTemporaryFile(max_size=SPOOL_BYTES)  # noqa: SIM115 (the upload's)
        self.sha, self.size = hashlib.sha256(), 0
        self.batch: list[bytes] = []
        self.batched = 0

    async def write(self, chunk: bytes) -> None:
        self.batch.append(chunk)
        self.batched += len(chunk)
        self.size += len(chunk)
        if self.batched >= BATCH_BYTES:
            await self.flush()

    async def flush(self) -> None:
        if self.batch:
            data, self.batch, self.batched = b"".join(self.batch), [], 0
            await asyncio.to_thread(self._store, data)

    def _store(self, data: bytes) -> None:
        self.file.write(data)
        self.sha.update(data)

    async def upload(self, kind: str, empty: str) -> tuple[UploadFile, str]:
        """An upload of it (what the upload routes read), and its sha256."""
        await self.flush()
        self.file.seek(0)
        if not self.size:
            self.file.close()
            raise BadRequestError(empty, param="body")
        file: Any = self.file  # (a binary file: what UploadFile reads)
        upload = UploadFile(file, size=self.size, headers=Headers({"content-type": kind}))
        return upload, self.sha.hexdigest()


async def body_file(request: Request) -> tuple[UploadFile, str]:
    """The raw body as an upload (spooled), and its sha256."""
    spool = Spool()
    kind = request.headers.get("content-type") or "application/octet-stream"
    try:
        async for chunk in request.stream():
            await spool.write(chunk)
        return await spool.upload(kind, "Send the audio as the request body.")
    except BaseException:  # (a body cut at the size limit, a client gone)
        spool.file.close()
        raise


async def url_file(ctx: AppContext, request: Request) -> tuple[UploadFile, str]:
    """A JSON body's URL, fetched from an allowed host (LISTEN_URL_HOSTS, `fetch.py`) within
    MAX_UPLOAD_MB, as an upload (spooled), and its sha256. Admitted before a byte is fetched
    (as `read_upload` admits: MAX_QUEUE, the budget's room); the fetch holds one of the
    app's fetch slots and stops when the client leaves."""
    fetches = ctx.fetches
    if not fetches.hosts:
        raise BadRequestError(
            "This server does not fetch audio from URLs (LISTEN_URL_HOSTS is empty): send the "
            "audio itself as the body (with its content type).",
            param="url",
        )
    url = await json_url(request)
    admission = ctx.scheduler.admit()
    on_request_end(request.scope, admission.release)
    spool = Spool()
    try:
        ctx.budget.check_room()
        async with fetches.slot():
            limit, tls = ctx.settings.max_upload_bytes, await fetches.tls()
            fetcher = UrlFetcher(fetches.hosts, limit, verify=tls)
            kind = await unless_client_leaves(request, fetcher.fetch(url, spool.write))
            upload = await spool.upload(kind, "The URL's content is empty.")
    except BaseException:
        spool.file.close()
        raise
    finally:
        # `read_upload` admits the upload again at once, before it awaits anything: held
        # twice, it would count twice against MAX_QUEUE
        admission.release()
    logger.info("listen: {} bytes fetched from {}", spool.size, redact_url(url.split("?")[0]))
    return upload


async def json_url(request: Request) -> str:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_JSON_BYTES:
            raise BadRequestError(f"The JSON body is over {MAX_JSON_BYTES} bytes.", param="url")
    try:
        url = json.loads(body)["url"]
    except (ValueError, TypeError, KeyError, RecursionError):  # (nested past Python's limit)
        url = None
    if not isinstance(url, str):
        raise BadRequestError('A JSON body must be {"url": "https://..."}.', param="url")
    return url


async def diarized_channels(ctx: AppContext, tracks: list[Audio], options: Options) -> Transcript:
    """diarize with multichannel: each channel diarized as its own file, its speakers kept
    (Deepgram numbers them per channel); the channels merged in time order."""
    jobs = [transcription(ctx, track, options, True) for track in tracks]
    results = list(await asyncio.gather(*jobs))
    speakers = [[s.speaker for s in r.segments] for r in results]
    merged = merge_channels(results, channel_names(None, len(results)))
    for result, said in zip(results, speakers, strict=True):  # (merge_channels names them)
        for segment, speaker in zip(result.segments, said, strict=True):
            segment.speaker = speaker
    return merged


async def as_wav(upload: UploadFile, query: FileQuery) -> UploadFile:
    """With `encoding`: a body that is no container (WAV, Ogg, FLAC, MP3, WebM, MP4) is raw
    audio in that encoding, at `sample_rate`, `channels` interleaved: given a WAV header
    (copied on a thread), it is read as any file is."""
    encoding = query.encoding
    assert encoding is not None

    def wrapped() -> UploadFile:
        head = upload.file.read(64)
        upload.file.seek(0)
        if is_wav(head) or compressed(head) is not None:
            return upload
        size = upload.size or 0
        spool = SpooledTemporaryFile(max_size=SPOOL_BYTES)  # noqa: SIM115 (the upload's)
        try:
            spool.write(wav_for_raw(encoding, query.sample_rate, query.channels, size))
            shutil.copyfileobj(upload.file, spool)
        except BaseException:
            spool.close()
            raise
        upload.file.close()
        spool.seek(0)
        file: Any = spool
        return UploadFile(file, size=size, headers=Headers({"content-type": "audio/wav"}))

    return await asyncio.to_thread(wrapped)


# Not in the OpenAPI schema: its bodies are Deepgram's (docs/DEEPGRAM.md), not the errors there
@router.post(LISTEN_PATH, include_in_schema=False)
async def listen_file(request: Request) -> JSONResponse:
    ctx: AppContext = request.app.state.ctx
    try:
        return await transcribe(ctx, request)
    except QueryError as exc:
        return deepgram_error(400, str(exc))
    except ServiceError as exc:
        if exc.code in OVERLOAD:  # Deepgram's answer to too much at once: 429, to retry
            return deepgram_error(429, exc.message, exc.retry_after, TOO_MANY_REQUESTS)
        status = http_status(exc)
        code = "REMOTE_CONTENT_ERROR" if status >= 500 and exc.param == "url" else None
        return deepgram_error(status, exc.message, exc.retry_after, code)


async def transcribe(ctx: AppContext, request: Request) -> JSONResponse:
    query = parse_file_query(request.query_params)
    kind = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
    decoding = ctx.transcriber.decoding(
        language=query.language,
        keywords=query.keywords or None,
        word_timestamps=True,
        segment_times=True,
    )
    options = Options(decoding)
    created = created_now()
    if kind == "application/json":
        upload, sha256 = await url_file(ctx, request)
    else:
        upload, sha256 = await body_file(request)
    try:
        if query.encoding is not None:
            upload = await as_wav(upload, query)
        if query.multichannel:
            tracks = await read_channels(ctx, request, upload)
            if query.diarize:
                work = diarized_channels(ctx, tracks, options)
            else:
                names = channel_names(None, len(tracks))
                work = transcribe_channels(ctx.transcriber, tracks, options, names)
            channels, duration = len(tracks), tracks[0].duration
        else:
            audio = await read_upload(ctx, request, upload)
            work = transcription(ctx, audio, options, query.diarize)
            channels, duration = 1, audio.duration
        result = await unless_client_leaves(request, work)
    finally:
        await upload.close()
    engine = ctx.manager.engine
    model_uuid, info = model_identity(engine.model_id, engine.name)
    metadata = m.Metadata(
        request_id=REQUEST_ID.get(),
        sha256=sha256,
        created=created,
        duration=round(duration, 3),
        channels=channels,
        models=[model_uuid],
        model_info={model_uuid: info},
    )
    return JSONResponse(file_body(result, query, metadata))
