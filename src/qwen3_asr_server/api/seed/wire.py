"""/ws/transcribe's server messages: the old server's shapes (partials, finals, errors,
buffer_reset), built from stream events. Beyond the old server, finals carry `start`/`end`
(seconds since the stream began) and, on a diarized stream, `speaker`; a message about one
channel of a multichannel stream carries `channel`. Clients of the old server read the
keys they know and are unaffected."""

from __future__ import annotations

from typing import Any

from ...audio.pcm import SAMPLE_RATE
from ...streaming.events import Final, FinalFailed, Partial, StreamEvent
from ...streaming.session import StreamSession
from ..error_table import http_status

ANSWERS = ("flush", "reset")  # a final that answers one of these is sent even when empty


def error(code: str, message: str, status: int) -> dict[str, Any]:
    return {"code": code, "message": message, "statusCode": status}


FINAL_MARK = {"is_partial": False, "is_final": True}
BUFFER_RESET = {"status": "buffer_reset"}


def answered(event: Final | FinalFailed) -> list[str]:
    """The flush/reset actions a final (or its failure) answers, in the order they came:
    the one that committed it, then those sent while it was pending."""
    return ([event.reason] if event.reason in ANSWERS else []) + list(event.answers)


def answer_messages(event: Final | FinalFailed) -> list[dict[str, Any]]:
    """The messages a final (or its failure, after its error) answers with, in the order the
    actions came: a final for each flush (the first final carries the text, later ones are
    empty) and a buffer_reset for each reset, after the final if one is sent. A reset gets a
    final only for the audio it committed itself, or to carry text; never an extra empty
    one (the old server's clients read one reply to a reset). A final with text that
    answers nothing is still sent; an empty one that answers nothing is not."""
    actions: list[str | None] = list(answered(event))
    text = event.text if isinstance(event, Final) else ""
    if not actions and text:
        actions = [None]
    messages: list[dict[str, Any]] = []
    sent = False  # the final carrying the text went out
    for i, action in enumerate(actions):
        own = i == 0 and event.reason == "reset"  # the reset committed this audio itself
        if action != "reset" or own or (text and not sent):
            messages.append(final_message("" if sent else text, event, sent))
            sent = True
        if action == "reset":
            messages.append(BUFFER_RESET)
    return messages


def final_message(text: str, event: Final | FinalFailed, extra: bool = False) -> dict[str, Any]:
    """A final: its text, where its audio lies in the stream (`start`, `end`: seconds since
    the stream began) and, on a diarized stream, `speaker` (null: not known in time; and on
    the empty finals that answer a second flush)."""
    message = {"text": text, **FINAL_MARK, "start": round(event.start, 3)}
    message["end"] = round(event.end, 3)
    if isinstance(event, Final) and event.diarized:
        message["speaker"] = None if extra else event.speaker
    return message


def final_error(event: FinalFailed) -> dict[str, Any]:
    """A final that failed, in the seed's error shape, with the failure's own status:
    503 (no backend, model unavailable, shutting down) and 504 (timeout) are retryable."""
    status = http_status(event.error)
    retryable = status in (503, 504)
    code = {503: "TRANSCRIPTION_UNAVAILABLE", 504: "TRANSCRIPTION_TIMEOUT"}
    body = error(code.get(status, "TRANSCRIPTION_FAILED"), event.error.message, status)
    body["retryable"] = retryable
    if retryable and event.error.retry_after is not None:
        body["retry_after"] = event.error.retry_after
    return body


def to_seed(event: StreamEvent) -> list[tuple[dict[str, Any], bool]]:
    """Stream event -> the seed's messages, each with whether it may be dropped for a slow
    reader (partials only). Turn events have no message in this protocol."""
    match event:
        case Partial():
            message = {"text": event.text, "is_partial": True, "is_final": False}
            return [({**message, "stable_text": event.stable_text}, True)]
        case Final():
            return [(message, False) for message in answer_messages(event)]
        case FinalFailed():
            # then what it answers (an empty final per flush): a client waits for its answer
            answers = answer_messages(event)
            return [(final_error(event), False), *((m, False) for m in answers)]
    return []


def tagged(message: dict[str, Any], channel: int | None) -> dict[str, Any]:
    """A message about one channel of a multichannel stream carries its number."""
    return message if channel is None else {**message, "channel": channel}


def empty_final(lane: StreamSession) -> dict[str, Any]:
    """The final that answers a flush with nothing buffered: empty, at the stream's end."""
    at = round(lane.samples_in / SAMPLE_RATE, 3)
    message: dict[str, Any] = {"text": "", **FINAL_MARK, "start": at, "end": at}
    if lane.config.diarize:
        message["speaker"] = None
    return message
