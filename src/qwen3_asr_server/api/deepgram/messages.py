"""Every message of WS /v1/listen as a pydantic model: what the server sends (`Results`,
`SpeechStarted`, `UtteranceEnd`, `Metadata`, `Error`, `ConfigureFailure`), with Deepgram's
field names (the tests re-validate each one against deepgram-sdk's own types), and what a
client sends (`KeepAlive`, `Finalize`, `CloseStream`, `Configure`), parsed from JSON text of
at most MAX_CONTROL_BYTES (the SDK puts a space after the colon)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Word(Strict):
    word: str
    start: float
    end: float
    confidence: float
    punctuated_word: str
    speaker: int | None = None  # with diarize only (left out otherwise)


class Alternative(Strict):
    transcript: str
    confidence: float
    words: list[Word]


class Channel(Strict):
    alternatives: list[Alternative]


class ModelInfo(Strict):
    name: str
    version: str
    arch: str


class ResultsMetadata(Strict):
    request_id: str
    model_info: ModelInfo
    model_uuid: str


class Results(Strict):
    type: Literal["Results"] = "Results"
    channel_index: list[int]  # [channel, channels]
    duration: float
    start: float
    is_final: bool
    speech_final: bool
    from_finalize: bool
    channel: Channel
    metadata: ResultsMetadata


class SpeechStarted(Strict):
    type: Literal["SpeechStarted"] = "SpeechStarted"
    channel: list[int]
    timestamp: float


class UtteranceEnd(Strict):
    type: Literal["UtteranceEnd"] = "UtteranceEnd"
    channel: list[int]
    last_word_end: float


class Metadata(Strict):
    type: Literal["Metadata"] = "Metadata"
    transaction_key: str = "deprecated"
    request_id: str
    sha256: str
    created: str
    duration: float
    channels: int
    models: list[str]
    model_info: dict[str, ModelInfo]


class Error(Strict):
    """A client message we could not use (the stream goes on): `variant` SchemaError,
    `message` the message as sent (cut to 1000 characters)."""

    type: Literal["Error"] = "Error"
    variant: str
    description: str
    message: str | None = None


class ConfigureFailure(Strict):
    """A `Configure` refused (we do not change a stream's options mid-stream)."""

    type: Literal["ConfigureFailure"] = "ConfigureFailure"
    request_id: str
    code: str
    description: str


class HandshakeError(Strict):
    """The body of a refused handshake (Deepgram's HTTP error shape)."""

    err_code: str
    err_msg: str
    request_id: str


def dump(message: BaseModel) -> dict[str, Any]:
    return message.model_dump(mode="json", exclude_none=True)


# -- client messages -------------------------------------------------------------------
class KeepAlive(BaseModel):
    type: Literal["KeepAlive"]


class Finalize(BaseModel):
    type: Literal["Finalize"]
    channel: int | None = Field(default=None, ge=0)  # one channel only (multichannel)


class CloseStream(BaseModel):
    type: Literal["CloseStream"]


class Configure(BaseModel):
    """deepgram-sdk's `send_configure` (new keyterms or features mid-stream): refused."""

    type: Literal["Configure"]
    keyterms: list[str] | None = None
    features: dict[str, bool] | None = None


Client = KeepAlive | Finalize | CloseStream | Configure
_CLIENT: TypeAdapter[Client] = TypeAdapter(Annotated[Client, Field(discriminator="type")])
MAX_CONTROL_BYTES = 4096  # a text frame (none of ours comes near it)


class MessageError(ValueError):
    pass


def parse_client(text: str) -> Client:
    """One client text frame; MessageError says what is wrong with it."""
    if len(text) > MAX_CONTROL_BYTES or len(text.encode()) > MAX_CONTROL_BYTES:
        raise MessageError(f"A text message is at most {MAX_CONTROL_BYTES} bytes.")
    try:
        return _CLIENT.validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        kind = first.get("type", "")
        if kind == "json_invalid":
            raise MessageError("The message is not JSON.") from None
        if kind in ("union_tag_invalid", "union_tag_not_found", "model_type"):
            raise MessageError(
                'Unknown message: send {"type": "KeepAlive"}, {"type": "Finalize"}, '
                '{"type": "CloseStream"} or {"type": "Configure"}.'
            ) from None
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or "message"
        raise MessageError(f"{where}: {first.get('msg', 'invalid')}.") from None
