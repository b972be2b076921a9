"""OpenAI Realtime wire format: error events, and stream events (streaming/events.py) ->
OpenAI server events. The session's settings and description are realtime_session.py.

`completed` carries `usage` (tokens when the engine counted them, else the seconds of the
client's audio), `languages` (the detected language) and, when the session's `include`
asks, `logprobs` of the final's tokens. A delta then carries the tokens of the partial it
came from that begin inside the delta's text (a delta is the stable prefix agreed across
partials; its tokens are those of the newest partial, the one that made it stable)."""

from __future__ import annotations

import uuid
from typing import Any

from ...outputs.formats import logprobs_body, token_usage_body
from ...streaming.events import (
    Committed,
    Final,
    FinalFailed,
    Partial,
    SpeechStarted,
    SpeechStopped,
    StreamEvent,
    TimedOut,
)
from ...transcript import TokenLogprob
from .realtime_session import RealtimeState


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


def item_id(utterance: int, state: RealtimeState) -> str:
    return f"item_{state.id[-8:]}_{utterance}"


def new_stable_text(event: Partial, state: RealtimeState) -> str:
    """The stable text of a partial that no delta of its utterance has carried yet."""
    sent = state.sent.get(event.utterance, "")
    stable = event.stable_text
    return stable[len(sent) :] if stable.startswith(sent) else ""


def tokens_within(
    tokens: tuple[TokenLogprob, ...], text: str, start: int, end: int
) -> list[TokenLogprob]:
    """The tokens that begin inside `text[start:end]`. Positions are counted in non-space
    characters of the tokens' bytes decoded together (a token may hold part of a character;
    the text may space CJK and Latin apart where the tokens do not)."""
    first, last = _solid(text[:start]), _solid(text[:end])
    inside, spelled = [], b""
    for token in tokens:
        begins = _solid(spelled.decode("utf-8", "ignore"))
        spelled += bytes(token.bytes) or token.token.encode()
        if first <= begins < last:
            inside.append(token)
    return inside


def _solid(text: str) -> int:
    """Non-space characters in `text`."""
    return sum(not c.isspace() for c in text)


def to_openai(event: StreamEvent, state: RealtimeState) -> dict[str, Any] | None:
    """Stream event -> OpenAI server event, or None when OpenAI would send nothing: speech
    started/stopped without turn detection, a delta with no new text."""
    base = {"event_id": event_id(), "item_id": item_id(event.utterance, state)}
    match event:
        case SpeechStarted() | SpeechStopped() if not state.config.use_vad:
            return None
        case TimedOut(start_ms=start_ms, end_ms=end_ms):
            timeout = {"audio_start_ms": start_ms, "audio_end_ms": end_ms}
            return {**base, "type": "input_audio_buffer.timeout_triggered", **timeout}
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
            before = state.sent.get(utt, "")
            state.sent[utt] = before + delta
            body: dict[str, Any] = {
                "type": "conversation.item.input_audio_transcription.delta",
                "delta": delta,
            }
            if state.logprobs:
                stable = before + delta
                tokens = tokens_within(event.logprobs or (), stable, len(before), len(stable))
                body["logprobs"] = logprobs_body(tokens)
            return {**base, "content_index": 0, **body}
        case Final(utterance=utt):
            state.sent.pop(utt, None)
            return {**base, **completed(event, state.logprobs)}
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


def completed(event: Final, logprobs: bool) -> dict[str, Any]:
    usage = (
        {"type": "tokens", **token_usage_body(event.usage)}
        if event.usage is not None
        else {"type": "duration", "seconds": round(event.duration, 3)}
    )
    body: dict[str, Any] = {
        "type": "conversation.item.input_audio_transcription.completed",
        "content_index": 0,
        "transcript": event.text,
        "usage": usage,
    }
    if event.language and event.text:
        body["languages"] = [{"code": event.language}]
    if logprobs:
        body["logprobs"] = logprobs_body(list(event.logprobs or ()))
    if event.diarized:  # this server's extension (`"diarize": true` in the session)
        body["speaker"] = event.speaker
    return body
