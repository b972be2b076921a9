"""WS /v1/realtime?intent=transcription: OpenAI Realtime transcription sessions.

Same session core as /ws/transcribe. Audio is base64 pcm16 (24 kHz unless the session says
otherwise) or G.711 μ-law/A-law (8 kHz), resampled to 16 kHz. Deltas carry only text that
will not change (the LocalAgreement-stable prefix); `completed` carries the final
transcript. Client events are parsed into the models of api/live/messages.py; a bad one gets an
`error` event and the session goes on. The session's settings and description are
realtime_session.py; the wire format (stream events -> server events) is realtime_wire.py.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import MutableMapping
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, WebSocket

from ...streaming.events import StreamEvent
from ...streaming.session import StreamSession
from ..deps import AppContext
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
from ..live.messages import (
    AppendEvent,
    ClearEvent,
    CommitEvent,
    MessageError,
    SessionConfig,
    SessionUpdateEvent,
    parse_realtime_event,
)
from ..secret_store import granted_secret
from .realtime_session import RealtimeState
from .realtime_wire import error_event, event_id, to_openai

router = APIRouter()


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
    # The same stream config as /ws/transcribe (WS_VAD_THRESHOLD, WS_END_SILENCE_MS, ...):
    # what session.created describes is what the session runs with.
    # live speakers label an item with its main speaker: an item is never split
    config = replace(base_config(ctx, settings.asr_use_server_vad, None), split_speakers=False)
    state = RealtimeState("sess_" + uuid.uuid4().hex[:20], config, settings.ws_max_session_s)
    outbox = Outbox(websocket, settings.ws_outbox_size)

    async def emit(event: StreamEvent) -> None:
        converted = to_openai(event, state)
        if converted is not None:
            await outbox.put(converted)

    session = new_session(ctx, config, emit, route_of(websocket))
    refused = await register(ctx, session, outbox, route_of(websocket))
    if refused:
        await websocket.send_json(error_event(refused, "too_many_sessions"))
        await websocket.close(1013)
        return
    try:  # from here on, whatever fails gives the seat back and ends the session's tasks
        secret = granted_secret(websocket.scope)
        if secret is not None:  # a client secret's session config is the session's defaults
            minted = {k: v for k, v in secret.session.items() if k in ("audio", "include")}
            session.configure(**state.apply(ctx, SessionConfig.model_validate(minted)))
            state.config = session.config
        described = state.describe(False)
        await outbox.put({"type": "session.created", "event_id": event_id(), "session": described})
    except BaseException as exc:
        if isinstance(exc, MessageError):  # (checked when minted: not expected)
            await outbox.put(error_event(exc.message, exc.code, None, exc.param))
        await release(ctx, websocket, session, outbox, "rejected", state.audio)
        if isinstance(exc, MessageError):
            return
        raise

    async def on_message(received: MutableMapping[str, Any]) -> str | None:
        text = received.get("text")
        if text is None:
            await outbox.put(error_event("Send JSON text events.", "invalid_event"))
            return None
        size = message_bytes(received)
        if size > settings.ws_max_frame_bytes:
            msg = f"Event of {size} bytes over WS_MAX_FRAME_BYTES."
            await outbox.put(error_event(msg, "event_too_large"))
            return None
        keep = await handle_event(ctx, session, state, outbox, text)
        return None if keep else "limit"

    idle = error_event("No events; closing the session.", "idle_timeout")
    await serve_session(ctx, websocket, session, outbox, on_message, idle, state.audio)


async def handle_event(
    ctx: AppContext,
    session: StreamSession,
    state: RealtimeState,
    outbox: Outbox,
    text: str,
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
            return await append(session, state, outbox, event)
        if isinstance(event, CommitEvent):
            await state.audio.drain(session)  # what the resampler held is this item's
            if await session.flush("commit") is None:
                raise MessageError(
                    "input_audio_buffer_commit_empty", "The input audio buffer is empty."
                )
        elif isinstance(event, ClearEvent):
            state.audio.clear()
            session.clear()
            await outbox.put({"type": "input_audio_buffer.cleared", "event_id": event_id()})
        elif isinstance(event, SessionUpdateEvent):
            # Only what the update sends changes; everything else keeps its value.
            session.configure(**state.apply(ctx, event.session))
            state.config = session.config
            beta = event.type.startswith("transcription_session")
            updated = "transcription_session.updated" if beta else "session.updated"
            described = state.describe(beta)
            await outbox.put({"type": updated, "event_id": event_id(), "session": described})
    except MessageError as exc:
        await outbox.put(error_event(exc.message, exc.code, event.event_id, exc.param))
    return True


async def append(
    session: StreamSession, state: RealtimeState, outbox: Outbox, event: AppendEvent
) -> bool:
    try:
        pcm = base64.b64decode(event.audio, validate=True)
    except (binascii.Error, ValueError):
        raise MessageError("invalid_audio", "audio must be base64.", "audio") from None
    if not await state.audio.feed(session, pcm):
        message = "Session audio limit reached (WS_MAX_SESSION_S)."
        await outbox.put(error_event(message, "session_too_long", event.event_id))
        return False
    return True
