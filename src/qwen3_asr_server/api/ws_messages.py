"""Typed client messages of the two WebSocket protocols (pydantic v2).

Every text message a client sends is parsed here before anything acts on it. Fields we do
not use are ignored (clients send many: `noise_reduction`, `include`, `model`, ...). A field
we use with a wrong type or out of its range raises MessageError, naming the parameter; the
endpoint answers with an error event and the connection stays open.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

REALTIME_RATES = (8000, 16000, 24000, 48000)


class MessageError(Exception):
    """A client message we cannot act on. `code` is one of invalid_json, invalid_event (not
    an object, no type/action), unknown_event, invalid_value, missing_required_parameter;
    each endpoint maps it to its protocol's error shape."""

    def __init__(
        self, code: str, message: str, param: str | None = None, event_id: str | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.event_id = event_id


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    def given(self, name: str) -> bool:
        """Whether the client sent this field (as opposed to its default applying)."""
        return name in self.model_fields_set


# --- /ws/transcribe text actions -------------------------------------------------------


class FlushAction(Message):
    action: Literal["flush"]


class ResetAction(Message):
    action: Literal["reset"]


class ConfigAction(Message):
    action: Literal["config"]
    language: str | None = None
    """An ISO code, a language name, `auto`; null or "" mean auto."""
    use_server_vad: bool = True
    """Applied only when sent. A bool, or the seed's bool-ish strings ("true"/"false",
    "1"/"0", "yes"/"no", ...)."""


TranscribeAction = FlushAction | ResetAction | ConfigAction
ACTIONS: Mapping[str, type[TranscribeAction]] = MappingProxyType(
    {"flush": FlushAction, "reset": ResetAction, "config": ConfigAction}
)


def parse_action(text: str) -> TranscribeAction:
    """A /ws/transcribe text message -> its action model, or MessageError."""
    data = load_object(text)
    name = data.get("action")
    if not isinstance(name, str):
        raise MessageError(
            "invalid_event",
            'Text messages need a string "action" (flush, reset, config).',
            "action",
        )
    model = ACTIONS.get(name)
    if model is None:
        raise MessageError("unknown_event", f"Unknown action {name!r}.", "action")
    return validate(model, data)


# --- /v1/realtime client events --------------------------------------------------------


class AudioFormat(Message):
    """GA `session.audio.input.format`."""

    type: Literal["audio/pcm"] = "audio/pcm"
    rate: int = 24000

    @field_validator("rate")
    @classmethod
    def _known_rate(cls, rate: int) -> int:
        if rate not in REALTIME_RATES:
            raise ValueError(f"unsupported audio rate {rate}; use one of {REALTIME_RATES}")
        return rate


class TranscriptionSettings(Message):
    language: str | None = None
    """An ISO code or a language name; null means auto."""


class TurnDetection(Message):
    """Server VAD settings; `semantic_vad` is served by the same VAD."""

    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    threshold: float = Field(0.5, ge=0, le=1)
    silence_duration_ms: int = Field(500, ge=100, le=5000)
    prefix_padding_ms: int = Field(300, ge=0, le=2000)


class AudioInput(Message):
    format: AudioFormat | None = None
    transcription: TranscriptionSettings | None = None
    turn_detection: TurnDetection | None = None  # null: server VAD off


class SessionAudio(Message):
    input: AudioInput | None = None


class SessionConfig(Message):
    """`session` of session.update (GA shape: `audio.input.*`) or of
    transcription_session.update (beta shape: `input_audio_*`, `turn_detection`). Where
    both shapes name a setting, the GA one wins."""

    audio: SessionAudio | None = None
    input_audio_format: Literal["pcm16"] | None = None
    input_audio_transcription: TranscriptionSettings | None = None
    turn_detection: TurnDetection | None = None

    def audio_input(self) -> AudioInput:
        return self.audio.input if self.audio and self.audio.input else AudioInput()

    def transcription(self) -> tuple[TranscriptionSettings | None, str]:
        """The transcription settings sent, and their parameter path (for errors)."""
        ga = self.audio_input().transcription
        if ga is not None:
            return ga, "session.audio.input.transcription"
        return self.input_audio_transcription, "session.input_audio_transcription"

    def rate(self) -> int | None:
        """The input rate, if the client sent a format (beta `pcm16` is 24 kHz)."""
        fmt = self.audio_input().format
        if fmt is not None:
            return fmt.rate
        return 24000 if self.input_audio_format is not None else None

    def turn_detection_setting(self) -> tuple[bool, TurnDetection | None]:
        """(sent, value): value None with sent True turns server VAD off."""
        audio_in = self.audio_input()
        if audio_in.given("turn_detection"):
            return True, audio_in.turn_detection
        if self.given("turn_detection"):
            return True, self.turn_detection
        return False, None


class RealtimeEvent(Message):
    type: str
    event_id: str | None = None


class AppendEvent(RealtimeEvent):
    type: Literal["input_audio_buffer.append"]
    audio: str
    """base64 pcm16 at the session's rate."""


class CommitEvent(RealtimeEvent):
    type: Literal["input_audio_buffer.commit"]


class ClearEvent(RealtimeEvent):
    type: Literal["input_audio_buffer.clear"]


class SessionUpdateEvent(RealtimeEvent):
    type: Literal["session.update", "transcription_session.update"]
    session: SessionConfig | None = None


REALTIME_EVENTS: Mapping[str, type[RealtimeEvent]] = MappingProxyType(
    {
        "input_audio_buffer.append": AppendEvent,
        "input_audio_buffer.commit": CommitEvent,
        "input_audio_buffer.clear": ClearEvent,
        "session.update": SessionUpdateEvent,
        "transcription_session.update": SessionUpdateEvent,
    }
)


def parse_realtime_event(text: str) -> RealtimeEvent:
    """A /v1/realtime client event -> its model, or MessageError carrying the event_id."""
    data = load_object(text)
    event_id = data.get("event_id")
    event_id = event_id if isinstance(event_id, str) else None
    kind = data.get("type")
    try:
        if not isinstance(kind, str):
            raise MessageError("invalid_event", 'Events need a string "type".', "type")
        model = REALTIME_EVENTS.get(kind)
        if model is None:
            raise MessageError("unknown_event", f"Unknown event type {kind!r}.", "type")
        return validate(model, data)
    except MessageError as exc:
        exc.event_id = event_id
        raise


# --- shared ------------------------------------------------------------------------------

M = TypeVar("M", bound=BaseModel)


def load_object(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError:
        raise MessageError("invalid_json", "Text messages must be JSON.") from None
    if not isinstance(data, dict):
        raise MessageError("invalid_event", "Text messages must be JSON objects.")
    return data


def validate(model: type[M], data: dict[str, Any]) -> M:
    """model.model_validate, with the first error turned into a MessageError that names the
    parameter as a dotted path (`session.audio.input.turn_detection.threshold`)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        param = ".".join(map(str, error["loc"])) or None
        message = error["msg"].removeprefix("Value error, ")
        message = re.sub(r"a valid dictionary or instance of \w+", "a JSON object", message)
        code = "missing_required_parameter" if error["type"] == "missing" else "invalid_value"
        raise MessageError(code, f"{param}: {message}.", param) from None
