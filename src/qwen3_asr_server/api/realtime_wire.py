"""OpenAI Realtime wire format: per-connection protocol state, the session description,
error events, and stream events (streaming/events.py) -> OpenAI server events."""

from __future__ import annotations

import uuid
from typing import Any

from ..streaming.events import (
    Committed,
    Final,
    FinalFailed,
    Partial,
    SpeechStarted,
    SpeechStopped,
    StreamEvent,
)
from ..streaming.ingest import PcmIngest
from ..streaming.session import StreamConfig

DEFAULT_RATE = 24000  # pcm16 at 24 kHz unless the session says otherwise


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
    """Per-connection protocol state: the stream config the session runs with (what
    `session.created`/`updated` describe), the audio ingest (client rate), item ids, and
    the text already sent as deltas."""

    def __init__(self, session_id: str, config: StreamConfig, max_seconds: float) -> None:
        self.id = session_id
        self.config = config
        self.audio = PcmIngest(DEFAULT_RATE, max_seconds)
        self.sent: dict[int, str] = {}  # utterance -> text already sent as deltas
        self.previous_item: str | None = None

    def describe(self, beta: bool) -> dict[str, Any]:
        cfg = self.config
        turn = (
            {
                "type": "server_vad",
                "threshold": cfg.vad_threshold,
                "prefix_padding_ms": cfg.prefix_padding_ms,
                "silence_duration_ms": cfg.end_silence_ms,
            }
            if cfg.use_vad
            else None
        )
        if beta:
            return {
                "id": self.id,
                "object": "realtime.transcription_session",
                "input_audio_format": "pcm16",
                "input_audio_transcription": {"model": "whisper-1", "language": cfg.language},
                "turn_detection": turn,
            }
        return {
            "type": "transcription",
            "id": self.id,
            "object": "realtime.transcription_session",
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": self.audio.rate},
                    "transcription": {"model": "whisper-1", "language": cfg.language},
                    "turn_detection": turn,
                }
            },
        }


def item_id(utterance: int, state: RealtimeState) -> str:
    return f"item_{state.id[-8:]}_{utterance}"


def new_stable_text(event: Partial, state: RealtimeState) -> str:
    """The stable text of a partial that no delta of its utterance has carried yet."""
    sent = state.sent.get(event.utterance, "")
    stable = event.stable_text
    return stable[len(sent) :] if stable.startswith(sent) else ""


def to_openai(event: StreamEvent, state: RealtimeState) -> dict[str, Any] | None:
    """Stream event -> OpenAI server event, or None when OpenAI would send nothing: speech
    started/stopped without turn detection, a delta with no new text."""
    base = {"event_id": event_id(), "item_id": item_id(event.utterance, state)}
    match event:
        case SpeechStarted() | SpeechStopped() if not state.config.use_vad:
            return None
        case SpeechStarted(at_ms=at_ms):
            return {**base, "type": "input_audio_buffer.speech_started", "audio_start_ms": at_ms}
        case SpeechStopped(at_ms=at_ms):
            return {**base, "type": "input_audio_buffer.speech_stopped", "audio_end_ms": at_ms}
        case Committed():
            committed = {
                "type": "input_audio_buffer.committed",
                "previous_item_id": state.previous_item,
            }
            state.previous_item = base["item_id"]
            return {**base, **committed}
        case Partial(utterance=utt):
            delta = new_stable_text(event, state)
            if not delta:
                return None
            state.sent[utt] = state.sent.get(utt, "") + delta
            body = {"type": "conversation.item.input_audio_transcription.delta", "delta": delta}
            return {**base, "content_index": 0, **body}
        case Final(utterance=utt):
            state.sent.pop(utt, None)
            return {
                **base,
                "type": "conversation.item.input_audio_transcription.completed",
                "content_index": 0,
                "transcript": event.text,
                "usage": {"type": "duration", "seconds": round(event.duration, 3)},
            }
        case FinalFailed():
            failed = {
                "type": "conversation.item.input_audio_transcription.failed",
                "content_index": 0,
                "error": {
                    "type": "server_error",
                    "code": event.error.code,
                    "message": event.error.message,
                    "param": None,
                },
            }
            return {**base, **failed}
    return None
