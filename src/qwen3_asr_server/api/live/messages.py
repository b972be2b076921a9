"""Typed client messages of the two WebSocket protocols (pydantic v2).

Every text message a client sends is parsed here before anything acts on it. Fields we do
not know are ignored. A field we know with a wrong type or out of its range raises
MessageError, naming the parameter; the endpoint answers with an error event and the
connection stays open. Decoding fields (language, prompt, keywords, languages) are checked
further by `decoding.build_decoding` when the endpoint applies them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from ...audio.g711 import RATE as G711_RATE

REALTIME_RATES = (8000, 16000, 24000, 48000)
# Realtime format names -> (ingest encoding, rate); GA `audio.input.format.type`, then beta
# `input_audio_format`
GA_ENCODINGS = MappingProxyType(
    {"audio/pcm": "pcm_s16le", "audio/pcmu": "mulaw", "audio/pcma": "alaw"}
)
BETA_FORMATS = MappingProxyType(
    {"pcm16": ("pcm_s16le", 24000), "g711_ulaw": ("mulaw", 8000), "g711_alaw": ("alaw", 8000)}
)
LOGPROBS_INCLUDE = "item.input_audio_transcription.logprobs"


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


# --- /v1/realtime client events --------------------------------------------------------


class AudioFormat(Message):
    """GA `session.audio.input.format`: `audio/pcm` (s16le; the SDK says 24 kHz, this server
    also takes 8, 16 and 48 kHz), `audio/pcmu` / `audio/pcma` (G.711, 8 kHz)."""

    type: Literal["audio/pcm", "audio/pcmu", "audio/pcma"] = "audio/pcm"
    rate: int = 24000

    @field_validator("rate")
    @classmethod
    def _known_rate(cls, rate: int) -> int:
        if rate not in REALTIME_RATES:
            raise ValueError(f"unsupported audio rate {rate}; use one of {REALTIME_RATES}")
        return rate

    @model_validator(mode="after")
    def _g711_is_8k(self) -> AudioFormat:
        if self.type != "audio/pcm" and self.given("rate") and self.rate != G711_RATE:
            raise ValueError(f"{self.type} is G.711 at {G711_RATE} Hz; omit rate or send 8000")
        return self

    def encoding(self) -> tuple[str, int]:
        """(ingest encoding, sample rate)."""
        if self.type == "audio/pcm":
            return "pcm_s16le", self.rate
        return GA_ENCODINGS[self.type], G711_RATE


class TranscriptionSettings(Message):
    model: str | None = None
    """Any name (whisper-1, gpt-4o-transcribe, ...): the served model answers; echoed."""
    language: str | None = None
    """An ISO code or a language name; null means auto."""
    prompt: str | None = None
    keywords: list[str] | None = None
    languages: list[str] | None = None
    """Candidate languages (ISO codes) for detection."""
    delay: Literal["minimal", "low", "medium", "high", "xhigh"] | None = None
    """How long the session waits for more speech before a final (end-of-speech silence)."""
    diarize: bool | None = None
    """This server's extension: label each completed transcription with `speaker`."""


class TurnDetection(Message):
    """Server VAD settings; `semantic_vad` is served by the same VAD, its `eagerness` mapped
    to an end-of-speech silence. `create_response`/`interrupt_response` are accepted and
    echoed (a transcription session makes no responses)."""

    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    threshold: float = Field(0.5, ge=0, le=1)
    silence_duration_ms: int = Field(500, ge=100, le=5000)
    prefix_padding_ms: int = Field(300, ge=0, le=2000)
    idle_timeout_ms: int | None = Field(None, ge=1000, le=600_000)
    eagerness: Literal["low", "medium", "high", "auto"] | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None


class NoiseReduction(Message):
    """Accepted and echoed; no filter is applied."""

    type: Literal["near_field", "far_field"] | None = None
    strength: float | None = Field(None, ge=0)


class AudioInput(Message):
    format: AudioFormat | None = None
    noise_reduction: NoiseReduction | None = None  # null: off
    transcription: TranscriptionSettings | None = None
    turn_detection: TurnDetection | None = None  # null: server VAD off


class SessionAudio(Message):
    input: AudioInput | None = None


Sent = tuple[bool, Any]  # (the client sent it, its value; None may mean "turn it off")


class SessionConfig(Message):
    """`session` of session.update (GA shape: `type`, `audio.input.*`, `include`) or of
    transcription_session.update (beta shape: `input_audio_*`, `turn_detection`,
    `include`). Where both shapes name a setting, the GA one wins."""

    type: str | None = None
    audio: SessionAudio | None = None
    include: list[Literal["item.input_audio_transcription.logprobs"]] | None = None
    input_audio_format: Literal["pcm16", "g711_ulaw", "g711_alaw"] | None = None
    input_audio_transcription: TranscriptionSettings | None = None
    input_audio_noise_reduction: NoiseReduction | None = None
    turn_detection: TurnDetection | None = None

    @field_validator("type")
    @classmethod
    def _transcription_only(cls, kind: str | None) -> str | None:
        if kind is not None and kind != "transcription":
            raise ValueError(
                f"only transcription sessions are served here, not {kind!r}; "
                'send "type": "transcription"'
            )
        return kind

    def audio_input(self) -> AudioInput:
        return self.audio.input if self.audio and self.audio.input else AudioInput()

    def _either(self, ga: str, beta: str) -> tuple[bool, Any, str]:
        """(sent, value, parameter path) of a setting both shapes name."""
        audio_in = self.audio_input()
        if audio_in.given(ga):
            return True, getattr(audio_in, ga), f"session.audio.input.{ga}"
        return self.given(beta), getattr(self, beta), f"session.{beta}"

    def transcription(self) -> tuple[bool, TranscriptionSettings | None, str]:
        """(sent, settings, their parameter path for errors); sent as null is (True, None)."""
        return self._either("transcription", "input_audio_transcription")

    def noise_reduction(self) -> Sent:
        sent, value, _ = self._either("noise_reduction", "input_audio_noise_reduction")
        return sent, value

    def encoding(self) -> tuple[str, int] | None:
        """(ingest encoding, rate), if the client sent a format."""
        fmt = self.audio_input().format
        if fmt is not None:
            return fmt.encoding()
        if self.input_audio_format is not None:
            return BETA_FORMATS[self.input_audio_format]
        return None

    def turn_detection_setting(self) -> tuple[bool, TurnDetection | None]:
        """(sent, value): value None with sent True turns server VAD off."""
        sent, value, _ = self._either("turn_detection", "turn_detection")
        return sent, value


class RealtimeEvent(Message):
    type: str
    event_id: str | None = None


class AppendEvent(RealtimeEvent):
    type: Literal["input_audio_buffer.append"]
    audio: str
    """base64 audio in the session's format (pcm16, or G.711 bytes)."""


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
    event_id = event_id if isinstance(event_id, str) and unicode_ok(event_id) else None
    kind = data.get("type")
    try:
        check_strings(data)
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
    """A JSON object, or MessageError: invalid_json (not JSON, or nested deeper than the
    parser's recursion limit), invalid_event (not an object)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise MessageError("invalid_json", "Text messages must be JSON.") from None
    if not isinstance(data, dict):
        raise MessageError("invalid_event", "Text messages must be JSON objects.")
    return data


def unicode_ok(text: str) -> bool:
    """False for a string with a lone surrogate (`"\\ud83d"` in JSON): not UTF-8, it can be
    neither echoed nor tokenized."""
    return text.isascii() or re.search("[\ud800-\udfff]", text) is None


def check_strings(data: Any) -> None:
    """MessageError (invalid_value, naming the parameter) for the first key or string that
    is not valid Unicode. Iterative: a message as deep as the parser allows is no risk."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str) and not unicode_ok(value):
            where = path or "a key"
            raise MessageError("invalid_value", f"{where}: not valid Unicode.", path or None)
        if isinstance(value, dict | list):
            pairs = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in pairs:  # a bad key is reported at its object's path
                named = f"{path}.{key}" if path else str(key)
                stack.append((item, named) if unicode_ok(str(key)) else (key, path))


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
