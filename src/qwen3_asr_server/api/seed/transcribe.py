"""WS /ws/transcribe: the seed's raw-PCM real-time protocol (see DESIGN.md §2).

Beyond the seed: `encoding=mulaw|alaw` with `sample_rate=8000` takes raw G.711 bytes (phone
bridges); `prompt` and `keywords` (query and `config` action) bias the decoder. In the query,
`keywords` may be repeated and each value is also split at commas.

`channels=2` (up to 8) takes interleaved frames, one speaker per channel (a call's two
sides): each channel has its own voice detection and utterances, and every message about
one channel (partial, final, a final's error, buffer_reset) carries `"channel": N`. A flush
or reset answers once per channel. Without `channels` the protocol is the seed's."""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from fastapi import APIRouter, WebSocket

from ...audio.channels import MAX_CHANNELS
from ...engines.base import TranscribeRequest
from ...errors import ServiceError
from ...streaming.channels import ChannelGroup
from ...streaming.events import Emit, StreamEvent
from ...streaming.ingest import Encoding, PcmIngest
from ...streaming.session import StreamSession
from ..deps import AppContext
from ..error_table import http_status
from ..live.common import (
    Outbox,
    base_config,
    choose_subprotocol,
    message_bytes,
    new_session,
    register,
    release,
    route_of,
    serve_session,
    websocket_api_key_ok,
)
from ..live.messages import MessageError
from ..live.speakers import check_available, speakers_config, speakers_sent
from .actions import FlushAction, ResetAction, parse_action
from .wire import (
    BUFFER_RESET,
    empty_final,
    error,
    tagged,
    to_seed,
)

router = APIRouter()
SAMPLE_RATES = (8000, 16000)
ENCODINGS: tuple[Encoding, ...] = ("pcm_s16le", "mulaw", "alaw")
SEED_CODES = MappingProxyType(  # MessageError codes -> the seed's; anything else INVALID_VALUE
    {
        "invalid_json": "INVALID_JSON",
        "invalid_event": "INVALID_ACTION",
        "unknown_event": "UNKNOWN_ACTION",
    }
)


@dataclass
class Echo:
    """What the client asked for, echoed by `config` as the seed did: the language as sent,
    `auto` when auto or unset; and the decoding fields as sent (`wishes`)."""

    language: str = "auto"
    wishes: dict[str, Any] = field(default_factory=dict)

    def decoding(self, ctx: AppContext, **changes: Any) -> tuple[TranscribeRequest, dict[str, Any]]:
        """The checked decoding template with `changes`, and the wishes that made it (kept
        by the caller once the whole config is accepted: a refused one changes nothing);
        ServiceError names the field."""
        wishes = {**self.wishes, **changes}
        return ctx.transcriber.decoding(**wishes), wishes


def decoding_error(exc: ServiceError) -> dict[str, Any]:
    code = "UNSUPPORTED_LANGUAGE" if exc.param == "language" else "INVALID_VALUE"
    return error(code, exc.message, 400)


def query_keywords(values: list[str]) -> list[str] | None:
    """`keywords=a&keywords=b,c` -> [a, b, c]; None when not sent."""
    if not values:
        return None
    return [word for value in values for word in value.split(",")]


def parse_bool(value: str | None, default: bool) -> bool:
    if value is None or value == "":
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


async def refuse(websocket: WebSocket, body: dict[str, Any], close_code: int) -> None:
    await websocket.send_json(body)
    await websocket.close(close_code)


@router.websocket("/ws/transcribe")
async def ws_transcribe(websocket: WebSocket) -> None:
    ctx: AppContext = websocket.app.state.ctx
    settings = ctx.settings
    await websocket.accept(subprotocol=choose_subprotocol(websocket))
    if not websocket_api_key_ok(ctx, websocket):
        await refuse(websocket, error("UNAUTHORIZED", "Missing or wrong API key.", 401), 1008)
        return
    query = websocket.query_params
    try:
        sample_rate = int(query.get("sample_rate") or 16000)
    except ValueError:
        sample_rate = -1
    if sample_rate not in SAMPLE_RATES:
        message = f"sample_rate must be 8000 or 16000, not {query.get('sample_rate')!r}."
        await refuse(websocket, error("UNSUPPORTED_SAMPLE_RATE", message, 400), 1003)
        return
    encoding = query.get("encoding") or "pcm_s16le"
    if encoding not in ENCODINGS or (encoding != "pcm_s16le" and sample_rate != 8000):
        message = (
            f"encoding must be pcm_s16le, or mulaw/alaw with sample_rate=8000, not {encoding!r}."
        )
        await refuse(websocket, error("UNSUPPORTED_ENCODING", message, 400), 1003)
        return
    try:
        channels = int(query.get("channels") or 1)
    except ValueError:
        channels = 0
    if not 1 <= channels <= MAX_CHANNELS:
        message = f"channels must be 1 to {MAX_CHANNELS}, not {query.get('channels')!r}."
        await refuse(websocket, error("UNSUPPORTED_CHANNELS", message, 400), 1003)
        return
    echo = Echo(query.get("language") or "auto")
    try:
        decoding, echo.wishes = echo.decoding(
            ctx,
            language=query.get("language"),
            prompt=query.get("prompt"),
            keywords=query_keywords(query.getlist("keywords")),
        )
    except ServiceError as exc:
        await refuse(websocket, decoding_error(exc), 1003)
        return
    use_vad = parse_bool(query.get("use_server_vad"), settings.asr_use_server_vad)
    diarize = parse_bool(query.get("diarize"), False)
    if diarize:
        try:
            check_available()
        except ServiceError as exc:
            await refuse(websocket, error("DIARIZATION_UNAVAILABLE", exc.message, 501), 1003)
            return
    outbox = Outbox(websocket, settings.ws_outbox_size)

    def emitter(channel: int | None) -> Emit:
        async def emit(event: StreamEvent) -> None:
            for message, droppable in to_seed(event):
                await outbox.put(tagged(message, channel), droppable=droppable)

        return emit

    config = replace(base_config(ctx, use_vad, decoding), diarize=diarize)
    route = route_of(websocket)
    lanes = [
        new_session(ctx, config, emitter(c if channels > 1 else None), route)
        for c in range(channels)
    ]
    session: StreamSession | ChannelGroup = lanes[0] if channels == 1 else ChannelGroup(lanes)
    refused = await register(ctx, session, outbox, route)
    if refused:
        await refuse(websocket, error("TOO_MANY_SESSIONS", refused, 503), 1013)
        return
    try:  # from here on, whatever fails (a cancellation too) gives the seat back
        width = 2 if encoding == "pcm_s16le" else 1  # bytes a sample (G.711: one)
        connected = {
            "status": "connected",
            "sample_rate": sample_rate,
            "format": encoding,
            "buffer_size": int(settings.ws_partial_interval * sample_rate) * width * channels,
            "window_max_s": settings.ws_window_max_s,
            "use_server_vad": use_vad,
        }
        if "channels" in query:
            connected["channels"] = channels
        if "diarize" in query:
            connected["diarize"] = diarize
        await outbox.put(connected)
        ingest = PcmIngest(sample_rate, settings.ws_max_session_s, encoding, channels)
    except BaseException:
        await release(ctx, websocket, session, outbox, "disconnect")
        raise

    async def on_message(received: MutableMapping[str, Any]) -> str | None:
        data, text = received.get("bytes"), received.get("text")
        size = message_bytes(received)
        if size > settings.ws_max_frame_bytes:
            limit = settings.ws_max_frame_bytes
            msg = f"Message of {size} bytes; the limit is {limit} (WS_MAX_FRAME_BYTES)."
            await outbox.put(error("FRAME_TOO_LARGE", msg, 413))
            return None
        if data is not None:
            if not await ingest.feed(session, data):
                limit_s = settings.ws_max_session_s
                msg = f"The session reached {limit_s:g} s of audio (WS_MAX_SESSION_S)."
                await outbox.put(error("SESSION_TOO_LONG", msg, 413))
                return "limit"
        elif text is not None:
            await handle_action(ctx, (session, lanes), ingest, outbox, echo, text)
        return None

    idle = error("IDLE_TIMEOUT", "No audio or message; closing.", 408)
    await serve_session(ctx, websocket, session, outbox, on_message, idle, ingest)


async def handle_action(
    ctx: AppContext,
    stream: tuple[StreamSession | ChannelGroup, list[StreamSession]],
    ingest: PcmIngest,
    outbox: Outbox,
    echo: Echo,
    text: str,
) -> None:
    """One text action. A bad one gets a seed error (statusCode 400); the session goes on.
    `stream` is the session fed by `ingest`, and its channels' sessions (itself if mono)."""
    session, lanes = stream
    try:
        action = parse_action(text)
    except MessageError as exc:
        code = SEED_CODES.get(exc.code, "INVALID_VALUE")
        await outbox.put(error(code, exc.message, 400))
        return
    if isinstance(action, FlushAction | ResetAction):
        # The answer comes after every final still pending, in order: the action's own
        # final, else the pending one (a flush's sent even if empty), else, with nothing at
        # all buffered, an empty final at once for a flush and only buffer_reset for a
        # reset (as the old server). A multichannel stream answers once per channel.
        await ingest.drain(session)
        if isinstance(session, ChannelGroup):
            await session.release()
        name = "flush" if isinstance(action, FlushAction) else "reset"
        for c, lane in enumerate(lanes):
            channel = c if len(lanes) > 1 else None
            item = await (lane.flush() if name == "flush" else lane.reset())
            if item is None and not lane.answer_pending(name):
                nothing = BUFFER_RESET if name == "reset" else empty_final(lane)
                await outbox.put(tagged(nothing, channel))
    else:
        changes: dict[str, Any] = {}
        sent = {
            k: getattr(action, k) for k in ("language", "prompt", "keywords") if action.given(k)
        }
        try:
            changes["decoding"], wishes = echo.decoding(ctx, **sent)
        except ServiceError as exc:
            await outbox.put(decoding_error(exc))
            return
        if action.given("use_server_vad"):
            changes["use_vad"] = action.use_server_vad
        try:
            known = await speakers_config(action, lanes[0].config.diarize, changes, ctx.vad)
        except ServiceError as exc:
            code = "DIARIZATION_UNAVAILABLE" if exc.code == "not_configured" else "INVALID_VALUE"
            await outbox.put(error(code, exc.message, http_status(exc)))
            return
        echo.wishes = wishes  # accepted as a whole: only now does anything change
        for lane in lanes:
            lane.configure(**changes)
            if known is not None:
                lane.know(known)
        if action.given("language"):
            echo.language = action.language or "auto"
        await outbox.put(
            {
                "status": "configured",
                "language": echo.language,
                "use_server_vad": lanes[0].config.use_vad,
                "prompt": lanes[0].config.decoding.prompt,
                "keywords": list(lanes[0].config.decoding.keywords),
                **({"diarize": lanes[0].config.diarize} if speakers_sent(action) else {}),
            }
        )
