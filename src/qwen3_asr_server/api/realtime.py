"""WS /v1/realtime?intent=transcription: OpenAI Realtime transcription sessions.

Same session core as /ws/transcribe. Audio is base64 pcm16 (24 kHz unless the session says
otherwise), resampled to 16 kHz. Deltas carry only text that will not change (the
LocalAgreement-stable prefix); `completed` carries the final transcript. Client events are
parsed into the models of ws_messages.py; a bad one gets an `error` event and the session
goes on.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import MutableMapping
from typing import Any

import soxr
from fastapi import APIRouter, WebSocket

from ..audio import pcm16_to_float
from ..errors import APIError
from ..streaming.session import StreamSession
from .deps import AppContext
from .ws_common import (
    Outbox,
    base_config,
    choose_subprotocol,
    new_session,
    register,
    serve_session,
    websocket_api_key_ok,
)
from .ws_messages import (
    AppendEvent,
    ClearEvent,
    CommitEvent,
    MessageError,
    SessionConfig,
    SessionUpdateEvent,
    parse_realtime_event,
)

router = APIRouter()


def event_id() -> str:
    return "event_" + uuid.uuid4().hex[:20]


def error_event(
    message: str, code: str, client_event: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """OpenAI's realtime error event; `client_event` is the event_id of the client event
    that caused it, `param` the offending field (a dotted path)."""
    return {
        "type": "error",
        "event_id": event_id(),
        "error": {
            "type": "invalid_request_error",
            "code": code,
            "message": message,
            "param": param,
            "event_id": client_event,
        },
    }


class RealtimeState:
    """Per-connection protocol state: rate, resampler, item ids, deltas sent."""

    def __init__(self, session_id: str, use_vad: bool, language: str | None) -> None:
        self.id = session_id
        self.rate = 24000
        self.resampler: Any = soxr.ResampleStream(24000, 16000, 1, dtype="float32")
        self.use_vad = use_vad
        self.language = language
        self.threshold = 0.5
        self.silence_ms = 500
        self.prefix_ms = 300
        self.sent: dict[int, str] = {}  # utterance -> text already sent as deltas
        self.previous_item: str | None = None

    def set_rate(self, rate: int) -> None:
        if rate != self.rate:
            self.rate = rate
            self.resampler = (
                None if rate == 16000 else soxr.ResampleStream(rate, 16000, 1, dtype="float32")
            )

    def describe(self, beta: bool) -> dict[str, Any]:
        turn = (
            {
                "type": "server_vad",
                "threshold": self.threshold,
                "prefix_padding_ms": self.prefix_ms,
                "silence_duration_ms": self.silence_ms,
            }
            if self.use_vad
            else None
        )
        if beta:
            return {
                "id": self.id,
                "object": "realtime.transcription_session",
                "input_audio_format": "pcm16",
                "input_audio_transcription": {"model": "whisper-1", "language": self.language},
                "turn_detection": turn,
            }
        return {
            "type": "transcription",
            "id": self.id,
            "object": "realtime.transcription_session",
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": self.rate},
                    "transcription": {"model": "whisper-1", "language": self.language},
                    "turn_detection": turn,
                }
            },
        }


def item_id(utterance: int, state: RealtimeState) -> str:
    return f"item_{state.id[-8:]}_{utterance}"


@router.websocket("/v1/realtime")
async def realtime(websocket: WebSocket) -> None:
    ctx: AppContext = websocket.app.state.ctx
    settings = ctx.settings
    await websocket.accept(subprotocol=choose_subprotocol(websocket))
    if not websocket_api_key_ok(ctx, websocket):
        await websocket.send_json(error_event("Missing or wrong API key.", "invalid_api_key"))
        await websocket.close(1008)
        return
    intent = websocket.query_params.get("intent", "transcription")
    if intent != "transcription":
        message = "Only transcription sessions are served here (intent=transcription)."
        await websocket.send_json(error_event(message, "unsupported_intent"))
        await websocket.close(1003)
        return
    state = RealtimeState("sess_" + uuid.uuid4().hex[:20], settings.asr_use_server_vad, None)
    outbox = Outbox(websocket, settings.ws_outbox_size)

    async def emit(event: dict[str, Any]) -> None:
        converted = to_openai(event, state)
        if converted is not None:
            await outbox.put(*converted)

    session = new_session(ctx, base_config(ctx, state.use_vad, None), emit)
    refused = await register(ctx, session, outbox)
    if refused:
        await websocket.send_json(error_event(refused, "too_many_sessions"))
        await websocket.close(1013)
        return
    created = {"type": "session.created", "event_id": event_id(), "session": state.describe(False)}
    await outbox.put(created)
    max_samples = int(settings.ws_max_session_s * 16000)

    async def on_message(received: MutableMapping[str, Any]) -> str | None:
        text = received.get("text")
        if text is None:
            await outbox.put(error_event("Send JSON text events.", "invalid_event"))
            return None
        if len(text) > settings.ws_max_frame_bytes:
            msg = f"Event of {len(text)} bytes over WS_MAX_FRAME_BYTES."
            await outbox.put(error_event(msg, "event_too_large"))
            return None
        keep = await handle_event(ctx, session, state, outbox, text, max_samples)
        return None if keep else "limit"

    idle = error_event("No events; closing the session.", "idle_timeout")
    await serve_session(ctx, websocket, session, outbox, on_message, idle)


def new_stable_text(event: dict[str, Any], state: RealtimeState) -> str:
    """The stable text of a partial that no delta of its utterance has carried yet."""
    sent = state.sent.get(event.get("utterance", 0), "")
    stable: str = event["stable_text"]
    return stable[len(sent) :] if stable.startswith(sent) else ""


def to_openai(event: dict[str, Any], state: RealtimeState) -> tuple[dict[str, Any], bool] | None:
    """Session event -> (OpenAI server event, droppable), or None when OpenAI would send
    nothing: speech started/stopped without turn detection, a delta with no new text."""
    kind, utt = event["type"], event.get("utterance", 0)
    if kind in ("speech_started", "speech_stopped") and not state.use_vad:
        return None
    if kind == "partial" and not new_stable_text(event, state):
        return None
    item = item_id(utt, state)
    base = {"event_id": event_id(), "item_id": item}
    if kind == "speech_started":
        started = {"type": "input_audio_buffer.speech_started", "audio_start_ms": event["at_ms"]}
        return {**base, **started}, False
    if kind == "speech_stopped":
        stopped = {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": event["at_ms"]}
        return {**base, **stopped}, False
    if kind == "committed":
        committed = {
            "type": "input_audio_buffer.committed",
            "previous_item_id": state.previous_item,
        }
        state.previous_item = item
        return {**base, **committed}, False
    if kind == "partial":
        delta = new_stable_text(event, state)
        state.sent[utt] = state.sent.get(utt, "") + delta
        body = {"type": "conversation.item.input_audio_transcription.delta", "delta": delta}
        return {**base, "content_index": 0, **body}, False
    if kind == "final":
        state.sent.pop(utt, None)
        return {
            **base,
            "type": "conversation.item.input_audio_transcription.completed",
            "content_index": 0,
            "transcript": event["text"],
            "usage": {"type": "duration", "seconds": round(event["duration"], 3)},
        }, False
    failed = {
        "type": "conversation.item.input_audio_transcription.failed",
        "content_index": 0,
        "error": {
            "type": "server_error",
            "code": event["code"],
            "message": event["message"],
            "param": None,
        },
    }
    return {**base, **failed}, False


async def handle_event(
    ctx: AppContext,
    session: StreamSession,
    state: RealtimeState,
    outbox: Outbox,
    text: str,
    max_samples: int,
) -> bool:
    """Handle one client event; False ends the session. A bad event gets an error event
    (naming the parameter and echoing the client's event_id) and the session goes on."""
    try:
        event = parse_realtime_event(text)
    except MessageError as exc:
        await outbox.put(error_event(exc.message, exc.code, exc.event_id, exc.param))
        return True
    try:
        if isinstance(event, AppendEvent):
            return await append(session, state, outbox, event, max_samples)
        if isinstance(event, CommitEvent):
            if await session.flush("commit") is None:
                raise MessageError(
                    "input_audio_buffer_commit_empty", "The input audio buffer is empty."
                )
        elif isinstance(event, ClearEvent):
            session.clear()
            await outbox.put({"type": "input_audio_buffer.cleared", "event_id": event_id()})
        elif isinstance(event, SessionUpdateEvent):
            apply_update(ctx, state, event.session)
            session.configure(
                use_vad=state.use_vad,
                language=state.language,
                vad_threshold=state.threshold,
                end_silence_ms=state.silence_ms,
                prefix_padding_ms=state.prefix_ms,
            )
            beta = event.type.startswith("transcription_session")
            updated = "transcription_session.updated" if beta else "session.updated"
            described = state.describe(beta)
            await outbox.put({"type": updated, "event_id": event_id(), "session": described})
    except MessageError as exc:
        await outbox.put(error_event(exc.message, exc.code, event.event_id, exc.param))
    return True


async def append(
    session: StreamSession,
    state: RealtimeState,
    outbox: Outbox,
    event: AppendEvent,
    max_samples: int,
) -> bool:
    try:
        pcm = base64.b64decode(event.audio, validate=True)
    except (binascii.Error, ValueError):
        raise MessageError("invalid_audio", "audio must be base64 pcm16.", "audio") from None
    samples = pcm16_to_float(pcm)
    if state.resampler is not None:
        samples = state.resampler.resample_chunk(samples)
    if session.samples_in + len(samples) > max_samples:
        message = "Session audio limit reached (WS_MAX_SESSION_S)."
        await outbox.put(error_event(message, "session_too_long", event.event_id))
        return False
    await session.feed(samples)
    return True


def apply_update(ctx: AppContext, state: RealtimeState, config: SessionConfig | None) -> None:
    """Check every setting first, then change the state: a bad update changes nothing."""
    if config is None:
        return
    language = state.language
    transcription, path = config.transcription()
    if transcription is not None and transcription.given("language"):
        try:
            language = ctx.transcriber.resolve_language(transcription.language)
        except APIError as exc:
            raise MessageError("invalid_value", exc.message, path + ".language") from None
    rate = config.rate()
    sent, turn = config.turn_detection_setting()
    state.language = language
    if rate is not None:
        state.set_rate(rate)
    if sent:
        state.use_vad = turn is not None
        if turn is not None:
            if turn.given("threshold"):
                state.threshold = turn.threshold
            if turn.given("silence_duration_ms"):
                state.silence_ms = turn.silence_duration_ms
            if turn.given("prefix_padding_ms"):
                state.prefix_ms = turn.prefix_padding_ms
