"""The text actions of /ws/transcribe (flush, reset, config), typed (pydantic v2), parsed
as every client message is (`api/live/messages.py`: unknown fields ignored, a wrong type or range
a MessageError naming the parameter)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

from ..live.messages import Message, MessageError, check_strings, load_object, validate


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
    prompt: str | None = None
    """Context for the decoder (null or "" clear it)."""
    keywords: list[str] | None = None
    """Words or phrases to bias recognition towards (null or [] clear them)."""
    diarize: bool = False
    """Live speakers: label each final with `speaker` (applied only when sent)."""
    known_speaker_names: list[str] | None = None
    """Known speakers' names (at most 4), each with a reference clip: their turns are
    labelled with these names, other voices with letters. [] forgets them."""
    known_speaker_references: list[str] | None = None
    """One data URL (data:audio/wav;base64,...) of a 2-10 s clip per name."""


TranscribeAction = FlushAction | ResetAction | ConfigAction
ACTIONS: Mapping[str, type[TranscribeAction]] = MappingProxyType(
    {"flush": FlushAction, "reset": ResetAction, "config": ConfigAction}
)


def parse_action(text: str) -> TranscribeAction:
    """A /ws/transcribe text message -> its action model, or MessageError."""
    data = load_object(text)
    check_strings(data)
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
