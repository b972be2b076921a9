"""A Realtime transcription session's settings: what session.update changes, and what
session.created / session.updated describe (the session as it really runs).

Mapped onto the stream config (`streaming/config.py`):
- `transcription.language/prompt/keywords/languages` -> the decoding template, checked by
  `decoding.build_decoding` (an `error` event naming the parameter on a bad value);
  `session.include` logprobs -> the template asks for logprobs (partials, for the deltas,
  and finals).
- end-of-speech silence: `turn_detection.silence_duration_ms` (server_vad), else
  `eagerness` (semantic_vad, EAGERNESS_SILENCE_MS), else `transcription.delay`
  (DELAY_SILENCE_MS), in that order within one update; a later update's wins.
- `turn_detection.idle_timeout_ms` (server_vad) -> `idle_timeout_ms`.
- echoed only: `transcription.model`, `noise_reduction` (no filter is applied),
  `create_response`/`interrupt_response` (a transcription session makes no responses).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from ...errors import ServiceError
from ...streaming.ingest import PcmIngest
from ...streaming.session import StreamConfig
from ..deps import AppContext
from ..live.messages import LOGPROBS_INCLUDE, MessageError, SessionConfig, TurnDetection
from ..live.speakers import check_available

DEFAULT_RATE = 24000  # pcm16 at 24 kHz unless the session says otherwise
DEFAULT_MODEL = "whisper-1"
# end-of-speech silence (ms) per semantic_vad eagerness and per transcription delay
EAGERNESS_SILENCE_MS = MappingProxyType({"high": 300, "medium": 600, "auto": 600, "low": 1200})
DELAY_SILENCE_MS = MappingProxyType(
    {"minimal": 200, "low": 350, "medium": 500, "high": 800, "xhigh": 1200}
)
DECODING_FIELDS = ("language", "prompt", "keywords", "languages")
BETA_FORMAT = MappingProxyType({"pcm_s16le": "pcm16", "mulaw": "g711_ulaw", "alaw": "g711_alaw"})
GA_FORMAT = MappingProxyType({"mulaw": "audio/pcmu", "alaw": "audio/pcma"})


@dataclass
class Echoed:
    """What the session says it runs with beyond the stream config: the client's own words."""

    model: str = DEFAULT_MODEL
    wishes: dict[str, Any] = field(default_factory=dict)  # decoding fields as sent
    delay: str | None = None
    include: list[str] = field(default_factory=list)
    turn_type: str = "server_vad"
    eagerness: str | None = None
    responses: dict[str, bool] = field(default_factory=dict)  # create/interrupt_response
    noise_reduction: dict[str, Any] | None = None


class RealtimeState:
    """Per-connection protocol state: the stream config the session runs with, what is
    echoed, the audio ingest (format and rate), item ids, text already sent as deltas."""

    def __init__(self, session_id: str, config: StreamConfig, max_seconds: float) -> None:
        self.id = session_id
        self.config = config
        self.echo = Echoed()
        self.audio = PcmIngest(DEFAULT_RATE, max_seconds)
        self.sent: dict[int, str] = {}  # utterance -> text already sent as deltas
        self.previous_item: str | None = None

    @property
    def logprobs(self) -> bool:
        return LOGPROBS_INCLUDE in self.echo.include

    # -- session.update ------------------------------------------------------------------
    def apply(self, ctx: AppContext, update: SessionConfig | None) -> dict[str, Any]:
        """Check every setting first, then change the state: a bad update changes nothing.
        Returns the changes to the stream config (only the settings the update sent)."""
        if update is None:
            return {}
        echo = replace(self.echo, wishes=dict(self.echo.wishes))
        changes: dict[str, Any] = {}
        sent, transcription, path = update.transcription()
        if sent and transcription is None:
            message = "A transcription session cannot turn transcription off."
            raise MessageError("invalid_value", message, path)
        if update.given("include"):
            echo.include = list(update.include or [])
        if transcription is not None:
            if transcription.given("model"):
                echo.model = transcription.model or DEFAULT_MODEL
            for name in DECODING_FIELDS:
                if transcription.given(name):
                    echo.wishes[name] = getattr(transcription, name)
            if transcription.given("delay"):
                echo.delay = transcription.delay
                if transcription.delay is not None:
                    changes["end_silence_ms"] = DELAY_SILENCE_MS[transcription.delay]
            if transcription.given("diarize"):
                changes["diarize"] = bool(transcription.diarize)
                if transcription.diarize:
                    try:
                        check_available()
                    except ServiceError as exc:
                        raise MessageError(
                            "invalid_value", exc.message, f"{path}.diarize"
                        ) from None
        try:
            logprobs = LOGPROBS_INCLUDE in echo.include
            changes["decoding"] = ctx.transcriber.decoding(**echo.wishes, logprobs=logprobs)
        except ServiceError as exc:
            param = f"{path}.{exc.param}" if exc.param else path
            raise MessageError("invalid_value", exc.message, param) from None
        turn_sent, turn = update.turn_detection_setting()
        if turn_sent:
            changes.update(self._turn(echo, turn))
        nr_sent, noise = update.noise_reduction()
        if nr_sent:
            echo.noise_reduction = noise.model_dump(exclude_none=True) if noise else None
        encoding = update.encoding()
        # every check passed: apply
        if encoding is not None:
            self.audio.set_rate(encoding[1], encoding[0])  # type: ignore[arg-type]
        self.echo = echo
        return changes

    @staticmethod
    def _turn(echo: Echoed, turn: TurnDetection | None) -> dict[str, Any]:
        changes: dict[str, Any] = {"use_vad": turn is not None}
        if turn is None:
            return changes
        echo.turn_type = turn.type
        echo.responses = {
            name: getattr(turn, name)
            for name in ("create_response", "interrupt_response")
            if getattr(turn, name) is not None
        }
        for name, key in (("threshold", "vad_threshold"), ("prefix_padding_ms", None)):
            if turn.given(name):
                changes[key or name] = getattr(turn, name)
        if turn.type == "semantic_vad":
            echo.eagerness = turn.eagerness or "auto"
            changes["end_silence_ms"] = EAGERNESS_SILENCE_MS[echo.eagerness]
            changes["idle_timeout_ms"] = None  # server_vad only (the SDK's types)
        else:
            echo.eagerness = None
            changes["idle_timeout_ms"] = turn.idle_timeout_ms
        if turn.given("silence_duration_ms"):
            changes["end_silence_ms"] = turn.silence_duration_ms
        return changes

    # -- session.created / session.updated ----------------------------------------------
    def describe(self, beta: bool) -> dict[str, Any]:
        cfg, echo = self.config, self.echo
        transcription: dict[str, Any] = {"model": echo.model, "language": echo_language(self)}
        for name in ("prompt", "keywords", "languages"):
            if echo.wishes.get(name):
                transcription[name] = echo.wishes[name]
        if echo.delay is not None:
            transcription["delay"] = echo.delay
        if cfg.diarize:
            transcription["diarize"] = True
        turn: dict[str, Any] | None = None
        if cfg.use_vad:
            turn = {"type": echo.turn_type}
            if echo.turn_type == "semantic_vad":
                turn["eagerness"] = echo.eagerness
            turn |= {
                "threshold": cfg.vad_threshold,
                "prefix_padding_ms": cfg.prefix_padding_ms,
                "silence_duration_ms": cfg.end_silence_ms,
            }
            if cfg.idle_timeout_ms is not None:
                turn["idle_timeout_ms"] = cfg.idle_timeout_ms
            turn |= echo.responses
        encoding = self.audio.encoding
        if beta:
            return {
                "id": self.id,
                "object": "realtime.transcription_session",
                # the SDK's type requires a client secret; this session was not opened with
                # one: the placeholder says so (no value, never expires)
                "client_secret": {"value": "", "expires_at": 0},
                "modalities": ["text"],
                "input_audio_format": BETA_FORMAT[encoding],
                "input_audio_transcription": transcription,
                "input_audio_noise_reduction": echo.noise_reduction,
                "include": echo.include,
                "turn_detection": turn,
            }
        fmt: dict[str, Any] = (
            {"type": "audio/pcm", "rate": self.audio.rate}
            if encoding == "pcm_s16le"
            else {"type": GA_FORMAT[encoding]}
        )
        return {
            "type": "transcription",
            "id": self.id,
            "object": "realtime.transcription_session",
            "include": echo.include,
            "audio": {
                "input": {
                    "format": fmt,
                    "noise_reduction": echo.noise_reduction,
                    "transcription": transcription,
                    "turn_detection": turn,
                }
            },
        }


def echo_language(state: RealtimeState) -> str | None:
    """The language the client forced (as an ISO code), None for auto."""
    return state.config.decoding.language if state.echo.wishes.get("language") else None
