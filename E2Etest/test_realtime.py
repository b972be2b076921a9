"""WS /v1/realtime?intent=transcription, driven by the openai SDK's realtime client as an
application would: session update, audio appends, server VAD or manual commits, errors."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import openai
import pytest
from e2e_support import (
    API_KEY,
    WAIT,
    WER_BOUND,
    Clip,
    Messages,
    normalize,
    streamable,
    wer,
    ws_connect,
)

pytestmark = pytest.mark.realtime

RATES = (8000, 16000, 24000, 48000)
COMPLETED = "conversation.item.input_audio_transcription.completed"
DELTA = "conversation.item.input_audio_transcription.delta"


@pytest.fixture(scope="module")
def rt_clip(clip: Clip, warm: None) -> Clip:
    return streamable(clip, RATES)


def connect(oai: openai.OpenAI) -> Any:
    return oai.realtime.connect(extra_query={"intent": "transcription"})


def append(conn: Any, pcm: bytes, rate: int, speed: float = 4.0) -> None:
    """input_audio_buffer.append in 100 ms pieces at `speed` times real time."""
    step = 2 * rate // 10
    for i in range(0, len(pcm), step):
        conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i : i + step]).decode())
        time.sleep(0.1 / speed)


def collect(conn: Any, until: Callable[[list[Any]], bool], timeout: float = WAIT) -> list[Any]:
    """Server events (parsed by the SDK) until `until(events)` or the timeout."""
    events: list[Any] = []

    def reader() -> None:
        try:
            while not until(events):
                events.append(conn.recv())
        except Exception:  # the connection closed
            return

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    thread.join(timeout)
    return events


def next_event(conn: Any, timeout: float = WAIT) -> Any:
    """The next server event; fails (instead of hanging) when none comes in time."""
    events = collect(conn, lambda ev: bool(ev), timeout)
    assert events, f"no server event within {timeout} s"
    return events[0]


def completed(events: list[Any]) -> list[Any]:
    return [e for e in events if e.type == COMPLETED]


def ga_update(rate: int, turn_detection: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "type": "transcription",
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": rate},
                "transcription": {"model": "whisper-1", "language": "en"},
                "turn_detection": turn_detection,
            }
        },
    }


def test_server_vad_session(oai: openai.OpenAI, rt_clip: Clip) -> None:
    vad = {"type": "server_vad", "threshold": 0.5, "silence_duration_ms": 500}
    with connect(oai) as conn:
        assert next_event(conn).type == "session.created"
        conn.session.update(session=ga_update(rt_clip.rate, vad))
        sender = threading.Thread(
            target=append, args=(conn, rt_clip.pcm_with_silence(1.5), rt_clip.rate)
        )
        sender.start()
        events = collect(conn, lambda ev: bool(completed(ev)))
        sender.join()
    types = [e.type for e in events]
    assert types[0] == "session.updated", types
    assert "error" not in types, [e for e in events if e.type == "error"]
    for expected in ("speech_started", "speech_stopped", "committed"):
        assert "input_audio_buffer." + expected in types, types
    (final,) = completed(events)
    assert wer([rt_clip.transcript], [final.transcript]) < WER_BOUND, final.transcript
    sent = "".join(e.delta for e in events if e.type == DELTA and e.item_id == final.item_id)
    assert normalize(final.transcript).startswith(normalize(sent)), "deltas are stable text"


def test_manual_commit_and_clear(oai: openai.OpenAI, rt_clip: Clip) -> None:
    with connect(oai) as conn:
        assert next_event(conn).type == "session.created"
        conn.send(  # the beta event shape; turn_detection None: commit by hand
            {
                "type": "transcription_session.update",
                "session": {
                    "turn_detection": None,
                    "input_audio_transcription": {"language": "en"},
                },
            }
        )
        assert next_event(conn).type == "transcription_session.updated"
        conn.session.update(session=ga_update(rt_clip.rate, None))
        assert next_event(conn).type == "session.updated"
        append(conn, rt_clip.pcm[: len(rt_clip.pcm) // 2], rt_clip.rate, speed=20)
        conn.input_audio_buffer.clear()
        cleared = collect(conn, lambda ev: bool(ev) and ev[-1].type.endswith("cleared"), 30)
        assert cleared and cleared[-1].type == "input_audio_buffer.cleared", cleared
        append(conn, rt_clip.pcm, rt_clip.rate, speed=20)
        conn.input_audio_buffer.commit()
        events = collect(conn, lambda ev: bool(completed(ev)))
    assert "input_audio_buffer.committed" in [e.type for e in events]
    finals = completed(events)
    assert len(finals) == 1, "the cleared audio produced nothing"
    assert wer([rt_clip.transcript], [finals[0].transcript]) < WER_BOUND, finals[0].transcript


def test_errors_use_openai_shape(oai: openai.OpenAI, warm: None) -> None:
    with connect(oai) as conn:
        assert next_event(conn).type == "session.created"
        conn.send({"type": "response.create"})  # not a transcription session's event
        error = next_event(conn)
        assert error.type == "error" and error.error.code == "unknown_event"
        assert error.error.message
        conn.input_audio_buffer.commit()  # nothing buffered
        assert next_event(conn).error.code == "input_audio_buffer_commit_empty"
        conn.send(
            {
                "type": "session.update",
                "event_id": "evt_e2e",
                "session": {"audio": {"input": {"transcription": {"language": "klingon"}}}},
            }
        )
        error = next_event(conn)
        assert error.type == "error" and error.error.code == "invalid_value"
        assert error.error.param == "session.audio.input.transcription.language"
        assert error.error.event_id == "evt_e2e"
        conn.input_audio_buffer.clear()  # the session goes on
        assert next_event(conn).type == "input_audio_buffer.cleared"


@pytest.mark.skipif(
    not API_KEY, reason="E2E_API_KEY is not set (set it when the deployment has API_KEY)"
)
def test_auth() -> None:
    path = "/v1/realtime"
    with ws_connect(path, key=None, intent="transcription") as ws:
        m = Messages(ws)
        assert m.wait_for(lambda m: m.items, 30)
        assert m.items[0]["type"] == "error", m.items
        assert m.items[0]["error"]["code"] == "invalid_api_key"
        assert m.closed.wait(30)
    assert ws.close_code == 1008
    # What the OpenAI JS SDK sends from a browser: the key as a subprotocol.
    offered = ["realtime", "openai-insecure-api-key." + str(API_KEY)]
    with ws_connect(path, key=None, subprotocols=offered, intent="transcription") as ws:
        assert ws.subprotocol == "realtime", "the key-bearing subprotocol is never echoed"
        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
