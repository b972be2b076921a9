"""WS /v1/listen: Deepgram's live transcription protocol, over the same session core as
/ws/transcribe and /v1/realtime (seats, outbox, finals never refused, priorities).

The query (`query.py`) is checked before the handshake completes: a wrong key is refused
with HTTP 401, a value we cannot serve with HTTP 400, a full server with 429, each with
Deepgram's body (`err_code`, `err_msg`, `request_id`) and its `dg-error` and `dg-request-id`
headers; an accepted handshake carries `dg-request-id` too. Once open, binary frames are
audio (linear16, mulaw or alaw, at `sample_rate`, `channels` interleaved; with no `encoding`,
a WAV header in the first frame sets them, and a compressed container is refused with 1008
`DATA-0000`: `containers.py`); text frames are `KeepAlive`, `Finalize`, `CloseStream` and
`Configure` (answered `ConfigureFailure`), at most 4 KiB (`messages.py`); one we cannot use
gets an `Error` message and the stream goes on. `CloseStream` (or an empty binary frame, or an
idle stream, DEEPGRAM_IDLE_TIMEOUT_S) finalises what is buffered, sends `Metadata` and closes
(an idle one with 1011 `NET-0001`; past WS_MAX_SESSION_S, 1008 `DATA-0000`).
With `multichannel=true` each channel is its own session (`ChannelGroup`); without it, the
channels are mixed into one."""

from __future__ import annotations

import hashlib
from collections.abc import MutableMapping
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, WebSocket
from fastapi.responses import JSONResponse
from loguru import logger

from ...audio.channels import MAX_CHANNELS
from ...audio.pcm import SAMPLE_RATE
from ...errors import ServiceError
from ...logging import HANDSHAKE_DENIED, REQUEST_ID
from ...streaming.channels import ChannelGroup
from ...streaming.events import Emit, StreamEvent
from ...streaming.ingest import PcmIngest
from ...streaming.session import StreamSession
from ..deps import AppContext
from ..live.common import (
    Ending,
    Outbox,
    any_key_ok,
    base_config,
    message_bytes,
    new_session,
    register,
    release,
    route_of,
    serve_session,
)
from ..live.speakers import check_available
from . import messages as m
from .containers import Undecodable, WavFormat, compressed, is_wav, wav_header
from .query import RATES, ListenQuery, QueryError, in_range, listen_tokens, parse_query
from .refusals import INVALID_AUTH, LISTEN_PATH, TOO_MANY_REQUESTS, error_body
from .response import created_now
from .wire import LIMIT, Wire, configure_failure, error

router = APIRouter()
# endpointing=false: no silence is long enough to end an utterance (finals come from Finalize,
# CloseStream and WS_MAX_UTTERANCE_S); voice detection still starts them (SpeechStarted)
NO_ENDPOINTING_MS = 10**9


def close_code(reason: str) -> tuple[int, str]:
    """An ending's close frame, with Deepgram's documented reasons only: 1011 `NET-0001` for
    an idle stream; 1008 `DATA-0000` (its one data reason: audio it cannot decode) for audio
    we cannot decode and for audio past WS_MAX_SESSION_S (its `Error` says which); 1011
    `NET-0000` for a fault of ours."""
    if reason == "idle":
        return 1011, "NET-0001"
    if reason in ("limit", "undecodable"):
        return 1008, "DATA-0000"
    if reason == "error":  # (a fault of ours: its Error was sent)
        return 1011, "NET-0000"
    return 1000, ""


async def refuse(websocket: WebSocket, status: int, code: str, message: str) -> None:
    """Refuse the handshake with an HTTP error, as Deepgram does; a server without the
    denial extension accepts, sends an `Error` and closes (1008 auth, else 1011)."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        header = message.encode("ascii", "replace").decode()
        headers = {"dg-error": header, "dg-request-id": REQUEST_ID.get()}
        body = error_body(status, message, code)
        HANDSHAKE_DENIED.set(True)
        await websocket.send_denial_response(JSONResponse(body, status, headers))
        return
    await websocket.accept()
    await websocket.send_json(error(message))
    await websocket.close(1008 if status == 401 else 1011, code)


@router.websocket(LISTEN_PATH)
async def listen(websocket: WebSocket) -> None:
    ctx: AppContext = websocket.app.state.ctx
    settings = ctx.settings
    offered: list[str] = list(websocket.scope.get("subprotocols") or [])
    if not any_key_ok(ctx, listen_tokens(websocket.headers.get("authorization"), offered)):
        await refuse(websocket, 401, INVALID_AUTH, "Invalid credentials.")
        return
    try:
        query = parse_query(websocket.query_params)
        decoding = ctx.transcriber.decoding(
            language=query.language, keywords=query.keywords or None
        )
        if query.diarize:
            check_available()
    except (QueryError, ServiceError) as exc:
        message = exc.message if isinstance(exc, ServiceError) else str(exc)
        await refuse(websocket, 400, "Bad Request", message)
        return
    config = replace(base_config(ctx, True, decoding), diarize=query.diarize)
    if query.endpointing is False:  # voice detection still finds speech; silence ends nothing
        config = replace(config, end_silence_ms=NO_ENDPOINTING_MS)
    elif query.endpointing:  # (milliseconds; None: WS_END_SILENCE_MS)
        config = replace(config, end_silence_ms=query.endpointing)
    width = query.channels if query.multichannel else 1
    outbox = Outbox(websocket, settings.ws_outbox_size)
    engine = ctx.manager.engine
    wire = Wire(query, REQUEST_ID.get(), engine.model_id, engine.name, width)

    def emitter(channel: int) -> Emit:
        async def emit(event: StreamEvent) -> None:
            position = lanes[channel].samples_in / SAMPLE_RATE
            for message, droppable in wire.event(channel, event, position):
                await outbox.put(message, droppable=droppable)

        return emit

    lanes = [new_session(ctx, config, emitter(c), route_of(websocket)) for c in range(width)]
    session: StreamSession | ChannelGroup = lanes[0] if width == 1 else ChannelGroup(lanes)
    ingest = PcmIngest(
        query.sample_rate,
        settings.ws_max_session_s,
        query.encoding,
        query.channels,
        mix=query.channels > 1 and not query.multichannel,
    )
    stream = Stream(ctx, query, wire, outbox, ingest, (session, lanes))
    refused = await register(ctx, session, outbox, route_of(websocket), stream.shutdown)
    if refused:
        await refuse(websocket, 429, TOO_MANY_REQUESTS, refused)
        return
    try:  # a client gone before the handshake ends gives its seat back
        await websocket.accept(
            subprotocol=offered[0] if offered[:1] and offered[0].lower() == "token" else None,
            headers=[(b"dg-request-id", REQUEST_ID.get().encode("ascii", "replace"))],
        )
    except BaseException:
        await release(ctx, websocket, session, outbox, "disconnect", ingest)
        raise

    ending = Ending(settings.deepgram_idle_timeout_s, stream.farewell, close_code)
    await serve_session(ctx, websocket, session, outbox, stream.on_message, None, ingest, ending)


class Stream:
    """One open stream's messages: audio, KeepAlive, Finalize, CloseStream, Configure."""

    def __init__(
        self,
        ctx: AppContext,
        query: ListenQuery,
        wire: Wire,
        outbox: Outbox,
        ingest: PcmIngest,
        sessions: tuple[StreamSession | ChannelGroup, list[StreamSession]],
    ) -> None:
        self.ctx, self.query, self.wire, self.outbox, self.ingest = ctx, query, wire, outbox, ingest
        self.session, self.lanes = sessions
        self.created = created_now()
        self.sha = hashlib.sha256()
        self.received = 0  # audio bytes
        self.head: bytes | None = b"" if query.sniff else None  # first bytes, not yet read
        self.said_farewell = False

    async def on_message(self, received: MutableMapping[str, Any]) -> str | None:
        """One client message handled; a fault of ours ends the stream as a fault: an
        `Error`, its finals and Metadata, then 1011 (never a clean 1000)."""
        try:
            return await self.handle(received)
        except Exception as exc:
            logger.opt(exception=exc).error("listen: a message could not be handled")
            why = f"The server failed on this message ({type(exc).__name__}): the stream ends."
            message = m.Error(variant="InternalError", description=why)
            await self.outbox.put(m.dump(message))
            return "error"

    async def handle(self, received: MutableMapping[str, Any]) -> str | None:
        data, text = received.get("bytes"), received.get("text")
        limit = self.ctx.settings.ws_max_frame_bytes
        size = message_bytes(received)
        if size > limit:
            msg = f"Message of {size} bytes; the limit is {limit} (WS_MAX_FRAME_BYTES)."
            await self.outbox.put(error(msg, variant=LIMIT))
            return None
        if data is not None:  # (an empty one: Deepgram's older CloseStream)
            return await self.audio(data) if data else "close_stream"
        if text is None:
            return None
        try:
            message = m.parse_client(text)
        except m.MessageError as exc:
            await self.outbox.put(error(str(exc), text[:1000]))
            return None
        if isinstance(message, m.CloseStream):
            return "close_stream"
        if isinstance(message, m.Configure):
            await self.outbox.put(configure_failure(self.wire.request_id, message))
        if isinstance(message, m.Finalize):
            await self.finalize(message.channel)
        return None  # (a KeepAlive: the idle timer starts again)

    async def audio(self, data: bytes) -> str | None:
        sent = data  # (hashed once taken: a refused frame counts in neither sha256 nor duration)
        if self.head is not None:
            sent = self.head + data
            unwrapped = await self.unwrap(sent)
            if not isinstance(unwrapped, bytes):
                return unwrapped  # (None: more of a WAV header to come)
            if not unwrapped:
                self.sha.update(sent)
                return None
            data = unwrapped
        if not await self.ingest.feed(self.session, data):
            limit_s = self.ctx.settings.ws_max_session_s
            msg = f"The stream reached {limit_s:g} s of audio (WS_MAX_SESSION_S)."
            await self.outbox.put(error(msg, variant=LIMIT))
            return "limit"
        self.sha.update(sent)
        self.received += len(data)
        for c, lane in enumerate(self.lanes):
            speaking = lane.turns.utterance is not None
            position = lane.samples_in / SAMPLE_RATE
            for message, _ in self.wire.utterance_end(c, position, speaking):
                await self.outbox.put(message)
        return None

    async def unwrap(self, head: bytes) -> bytes | str | None:
        """The stream's first bytes, sent with no `encoding`: a WAV's header read and taken
        off (None: more of it to come); a compressed container refused ("undecodable");
        anything else is raw audio as the query says."""
        self.head = None
        try:
            if (name := compressed(head)) is not None:
                raise Undecodable(
                    f"{name} audio is not decoded on a live stream: send raw audio with "
                    "encoding=linear16, mulaw or alaw (and its sample_rate), or POST the file "
                    "to /v1/listen."
                )
            if not is_wav(head):
                return head
            wav = wav_header(head)
            if wav is None:
                self.head = head
                return None
            self.use(wav)
        except (Undecodable, QueryError) as exc:
            await self.outbox.put(m.dump(m.Error(variant="DecodeError", description=str(exc))))
            return "undecodable"
        return head[wav.header :]

    def use(self, wav: WavFormat) -> None:
        """A WAV header's format for the rest of the stream, checked as the query's is."""
        try:
            rate = in_range("sample_rate", wav.sample_rate, *RATES)
            channels = in_range("channels", wav.channels, 1, MAX_CHANNELS)
        except QueryError as exc:
            raise Undecodable(f"The WAV header's {exc}") from None
        multi = self.query.multichannel
        if multi and channels != self.query.channels:
            raise Undecodable(
                f"The WAV has {channels} channel(s): with multichannel=true, send "
                f"channels={channels} in the query."
            )
        self.query = replace(self.query, encoding=wav.encoding, sample_rate=rate, channels=channels)
        self.wire.query = self.query
        self.ingest.set_channels(channels, mix=channels > 1 and not multi)
        self.ingest.set_rate(rate, wav.encoding)
        logger.info(
            "listen: a WAV stream, {} at {} Hz, {} channel(s)", wav.encoding, rate, channels
        )

    async def finalize(self, channel: int | None) -> None:
        """Every channel's buffered audio (or one channel's) finalised; a channel with
        nothing buffered answers with an empty final."""
        if channel is not None and self.query.multichannel and channel >= len(self.lanes):
            await self.outbox.put(error(f"Finalize: no channel {channel}."))
            return
        await self.ingest.drain(self.session)
        if isinstance(self.session, ChannelGroup):
            await self.session.release()
        for c, lane in enumerate(self.lanes):
            if channel is not None and self.query.multichannel and c != channel:
                continue
            item = await lane.flush()
            if item is None and not lane.answer_pending("flush"):
                position = lane.samples_in / SAMPLE_RATE
                await self.outbox.put(self.wire.finalized_nothing(c, position))

    async def shutdown(self) -> None:
        """The server shuts down (its finals are out): Metadata before uvicorn's 1012."""
        await self.farewell("shutdown")
        await self.outbox.drain()

    async def farewell(self, reason: str) -> None:
        """Metadata, after the last final (CloseStream, idle, limit, shutdown), once."""
        if self.said_farewell:
            return
        self.said_farewell = True
        sample_bytes = 2 if self.query.encoding == "pcm_s16le" else 1
        duration = self.received / (self.query.sample_rate * sample_bytes * self.query.channels)
        await self.outbox.put(self.wire.metadata(self.created, duration, self.sha.hexdigest()))
