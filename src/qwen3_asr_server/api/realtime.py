"""WS /v1/realtime?intent=transcription: OpenAI Realtime transcription sessions.

Same session core as /ws/transcribe. Audio is base64 pcm16 (24 kHz unless the session says
otherwise), resampled to 16 kHz. Deltas carry only text that will not change (the
LocalAgreement-stable prefix); `completed` carries the final transcript.
"""

from __future__ import annotations

import base64
import binascii
import json
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
    new_session,
    register,
    serve_session,
    websocket_api_key_ok,
)

router = APIRouter()
RATES = (8000, 16000, 24000, 48000)


def event_id() -> str:
    return "event_" + uuid.uuid4().hex[:20]


def error_event(message: str, code: str, client_event: str | None = None) -> dict[str, Any]:
    return {
        "type": "error",
        "event_id": event_id(),
        "error": {
            "type": "invalid_request_error",
            "code": code,
            "message": message,
            "param": None,
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
    await websocket.accept()
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
        await outbox.put(*to_openai(event, state))

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


def to_openai(event: dict[str, Any], state: RealtimeState) -> tuple[dict[str, Any], bool]:
    """Session event -> (OpenAI server event, droppable)."""
    kind, utt = event["type"], event.get("utterance", 0)
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
        sent = state.sent.get(utt, "")
        stable = event["stable_text"]
        delta = stable[len(sent) :] if stable.startswith(sent) else ""
        state.sent[utt] = sent + delta
        body = {"type": "conversation.item.input_audio_transcription.delta", "delta": delta}
        return {**base, "content_index": 0, **body}, not delta
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
        "error": {"type": "server_error", "code": event.get("code"), "message": event["message"]},
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
    """Handle one client event; False ends the session."""
    try:
        event = json.loads(text)
        kind = event["type"]
    except (ValueError, KeyError, TypeError):
        await outbox.put(error_event("Events must be JSON objects with a type.", "invalid_json"))
        return True
    client_event = event.get("event_id")
    if kind == "input_audio_buffer.append":
        try:
            pcm = base64.b64decode(event.get("audio", ""), validate=True)
        except (binascii.Error, ValueError):
            await outbox.put(
                error_event("audio must be base64 pcm16.", "invalid_audio", client_event)
            )
            return True
        samples = pcm16_to_float(pcm)
        if state.resampler is not None:
            samples = state.resampler.resample_chunk(samples)
        if session.samples_in + len(samples) > max_samples:
            await outbox.put(
                error_event("Session audio limit reached (WS_MAX_SESSION_S).", "session_too_long")
            )
            return False
        await session.feed(samples)
    elif kind == "input_audio_buffer.commit":
        if await session.flush("commit") is None:
            msg = "The input audio buffer is empty."
            await outbox.put(error_event(msg, "input_audio_buffer_commit_empty", client_event))
    elif kind == "input_audio_buffer.clear":
        session.clear()
        await outbox.put({"type": "input_audio_buffer.cleared", "event_id": event_id()})
    elif kind in ("session.update", "transcription_session.update"):
        try:
            apply_update(ctx, state, event.get("session") or {})
        except APIError as exc:
            await outbox.put(error_event(exc.message, "invalid_value", client_event))
            return True
        session.configure(
            use_vad=state.use_vad,
            language=state.language,
            vad_threshold=state.threshold,
            end_silence_ms=state.silence_ms,
            prefix_padding_ms=state.prefix_ms,
        )
        beta = kind.startswith("transcription_session")
        updated = "transcription_session.updated" if beta else "session.updated"
        await outbox.put({"type": updated, "event_id": event_id(), "session": state.describe(beta)})
    else:
        await outbox.put(
            error_event(f"Unknown event type {kind!r}.", "unknown_event", client_event)
        )
    return True


def apply_update(ctx: AppContext, state: RealtimeState, session: dict[str, Any]) -> None:
    audio_in = (session.get("audio") or {}).get("input") or {}
    transcription = audio_in.get("transcription") or session.get("input_audio_transcription")
    if transcription and "language" in transcription:
        state.language = ctx.transcriber.resolve_language(transcription["language"])
    fmt = audio_in.get("format")
    if isinstance(fmt, dict) and fmt.get("rate"):
        rate = int(fmt["rate"])
        if rate not in RATES:
            from ..errors import BadRequestError

            raise BadRequestError(f"Unsupported audio rate {rate}; use one of {RATES}.")
        state.set_rate(rate)
    if "turn_detection" in audio_in or "turn_detection" in session:
        turn = audio_in.get("turn_detection", session.get("turn_detection"))
        state.use_vad = bool(turn)
        if turn:
            state.threshold = float(turn.get("threshold", state.threshold))
            state.silence_ms = int(turn.get("silence_duration_ms", state.silence_ms))
            state.prefix_ms = int(turn.get("prefix_padding_ms", state.prefix_ms))
