"""Check response bodies, SSE events and error bodies against the openai SDK's own pydantic
types (`model_validate`), so a field the SDK requires can never silently go missing."""

from __future__ import annotations

import json
from typing import Any

from openai.types.audio import (
    Transcription,
    TranscriptionTextDeltaEvent,
    TranscriptionTextDoneEvent,
    TranscriptionVerbose,
    Translation,
)

ERROR_FIELDS = {"message", "type", "param", "code"}
STREAM_EVENTS: dict[str, Any] = {
    "transcript.text.delta": TranscriptionTextDeltaEvent,
    "transcript.text.done": TranscriptionTextDoneEvent,
}


def check_transcription(body: Any, response_format: str = "json") -> Any:
    """A json or verbose_json transcription body, parsed by the SDK's type."""
    if response_format == "verbose_json":
        verbose = TranscriptionVerbose.model_validate(body)
        assert verbose.segments is not None
        assert [s.id for s in verbose.segments] == list(range(len(verbose.segments)))
        return verbose
    assert response_format == "json", response_format
    return Transcription.model_validate(body)


def check_translation(body: Any) -> Translation:
    return Translation.model_validate(body)


def sse_data(text: str) -> list[str]:
    """The `data:` payloads of an SSE body, in order."""
    return [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]


def check_stream(text: str) -> list[Any]:
    """An OpenAI transcription stream: deltas, one done, then `[DONE]`; every event typed."""
    payloads = sse_data(text)
    assert payloads and payloads[-1] == "[DONE]", payloads[-1:]
    events = []
    for raw in payloads[:-1]:
        payload = json.loads(raw)
        kind = STREAM_EVENTS.get(payload.get("type"))
        assert kind is not None, payload
        events.append(kind.model_validate(payload))
    assert [e.type for e in events][-1] == "transcript.text.done"
    assert {e.type for e in events[:-1]} <= {"transcript.text.delta"}
    return events


def check_error(body: Any) -> dict[str, Any]:
    """OpenAI's error shape, exactly: {"error": {"message", "type", "param", "code"}}."""
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == ERROR_FIELDS, error
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] in ("invalid_request_error", "server_error")
    return error


def check_realtime_event(raw: str | bytes) -> Any:
    """A /v1/realtime server event, validated (not just constructed) as the SDK's
    `RealtimeServerEvent` union, picked by its `type`."""
    from openai.types.realtime import RealtimeServerEvent
    from pydantic import TypeAdapter

    event = TypeAdapter(RealtimeServerEvent).validate_json(raw)
    assert event.type == json.loads(raw)["type"]
    return event
