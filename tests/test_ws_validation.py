"""Malformed client messages on both WebSocket endpoints: each gets an error event in its
protocol's shape, and the connection stays open (the next valid message still works)."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from openai.types.realtime import RealtimeErrorEvent
from websockets.sync.client import ClientConnection, connect

from helpers import whisper_settings
from qwen3_asr_server.app import create_app
from server import LiveServer, live_server
from streaming_client import Collector, load, open_ws, pcm16
from wer import normalize

pytestmark = pytest.mark.slow

GA_INPUT = "session.audio.input"


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(create_app(whisper_settings())) as srv:
        yield srv


def realtime_ws(server: LiveServer) -> ClientConnection:
    url = server.url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
    ws = connect(url, open_timeout=30)
    assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
    return ws


def next_event(ws: ClientConnection) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(ws.recv(timeout=10))
    return event


def ga_input(**fields: Any) -> str:
    session = {"type": "transcription", "audio": {"input": fields}}
    return json.dumps({"type": "session.update", "event_id": "evt_bad", "session": session})


def ga_update(**fields: Any) -> dict[str, Any]:
    return {"type": "session.update", "session": {"audio": {"input": fields}}}


def beta_update(**session: Any) -> str:
    return json.dumps(
        {"type": "transcription_session.update", "event_id": "evt_bad", "session": session}
    )


REALTIME_BAD = [
    # (id, raw text, code, param)
    ("not json", "{type", "invalid_json", None),
    ("json list", "[1, 2]", "invalid_event", None),
    ("json string", '"session.update"', "invalid_event", None),
    ("json null", "null", "invalid_event", None),
    ("no type", json.dumps({"event_id": "evt_bad"}), "invalid_event", "type"),
    ("type not a string", json.dumps({"type": 5, "event_id": "evt_bad"}), "invalid_event", "type"),
    (
        "threshold null",
        ga_input(turn_detection={"type": "server_vad", "threshold": None}),
        "invalid_value",
        f"{GA_INPUT}.turn_detection.threshold",
    ),
    (
        "threshold over 1",
        ga_input(turn_detection={"type": "server_vad", "threshold": 1.5}),
        "invalid_value",
        f"{GA_INPUT}.turn_detection.threshold",
    ),
    (
        "silence too short",
        ga_input(turn_detection={"type": "server_vad", "silence_duration_ms": 50}),
        "invalid_value",
        f"{GA_INPUT}.turn_detection.silence_duration_ms",
    ),
    (
        "prefix padding too long",
        beta_update(turn_detection={"type": "server_vad", "prefix_padding_ms": 2500}),
        "invalid_value",
        "session.turn_detection.prefix_padding_ms",
    ),
    (
        "turn detection type",
        beta_update(turn_detection={"type": "push_to_talk"}),
        "invalid_value",
        "session.turn_detection.type",
    ),
    (
        "rate 24k",
        ga_input(format={"type": "audio/pcm", "rate": "24k"}),
        "invalid_value",
        f"{GA_INPUT}.format.rate",
    ),
    (
        "rate not allowed",
        ga_input(format={"type": "audio/pcm", "rate": 44100}),
        "invalid_value",
        f"{GA_INPUT}.format.rate",
    ),
    (
        "unknown format",
        ga_input(format={"type": "audio/opus"}),
        "invalid_value",
        f"{GA_INPUT}.format.type",
    ),
    (
        "mu-law at 16 kHz",
        ga_input(format={"type": "audio/pcmu", "rate": 16000}),
        "invalid_value",
        f"{GA_INPUT}.format",
    ),
    (
        "beta unknown format",
        beta_update(input_audio_format="g722"),
        "invalid_value",
        "session.input_audio_format",
    ),
    (
        "realtime session type",
        json.dumps(
            {"type": "session.update", "event_id": "evt_bad", "session": {"type": "realtime"}}
        ),
        "invalid_value",
        "session.type",
    ),
    (
        "transcription turned off",
        ga_input(transcription=None),
        "invalid_value",
        f"{GA_INPUT}.transcription",
    ),
    (
        "unknown include",
        json.dumps(
            {"type": "session.update", "event_id": "evt_bad", "session": {"include": ["x"]}}
        ),
        "invalid_value",
        "session.include.0",
    ),
    (
        "too many keywords",
        ga_input(transcription={"keywords": [f"w{i}" for i in range(101)]}),
        "invalid_value",
        f"{GA_INPUT}.transcription.keywords",
    ),
    (
        "unknown candidate language",
        ga_input(transcription={"languages": ["en", "klingon"]}),
        "invalid_value",
        f"{GA_INPUT}.transcription.languages",
    ),
    (
        "prompt a number",
        beta_update(input_audio_transcription={"prompt": 5}),
        "invalid_value",
        "session.input_audio_transcription.prompt",
    ),
    (
        "unknown delay",
        ga_input(transcription={"delay": "slow"}),
        "invalid_value",
        f"{GA_INPUT}.transcription.delay",
    ),
    (
        "unknown eagerness",
        ga_input(turn_detection={"type": "semantic_vad", "eagerness": "eager"}),
        "invalid_value",
        f"{GA_INPUT}.turn_detection.eagerness",
    ),
    (
        "idle timeout too short",
        ga_input(turn_detection={"type": "server_vad", "idle_timeout_ms": 10}),
        "invalid_value",
        f"{GA_INPUT}.turn_detection.idle_timeout_ms",
    ),
    (
        "session is a list",
        json.dumps({"type": "session.update", "event_id": "evt_bad", "session": [1]}),
        "invalid_value",
        "session",
    ),
    (
        "session is a string",
        json.dumps({"type": "session.update", "event_id": "evt_bad", "session": "en"}),
        "invalid_value",
        "session",
    ),
    (
        "language a number",
        ga_input(transcription={"model": "whisper-1", "language": 5}),
        "invalid_value",
        f"{GA_INPUT}.transcription.language",
    ),
    (
        "beta language a list",
        beta_update(input_audio_transcription={"language": ["en"]}),
        "invalid_value",
        "session.input_audio_transcription.language",
    ),
    (
        "language unknown",
        beta_update(input_audio_transcription={"language": "klingon"}),
        "invalid_value",
        "session.input_audio_transcription.language",
    ),
    (
        "audio not a string",
        json.dumps({"type": "input_audio_buffer.append", "event_id": "evt_bad", "audio": 5}),
        "invalid_value",
        "audio",
    ),
    (
        "audio missing",
        json.dumps({"type": "input_audio_buffer.append", "event_id": "evt_bad"}),
        "missing_required_parameter",
        "audio",
    ),
    (
        "audio not base64",
        json.dumps({"type": "input_audio_buffer.append", "event_id": "evt_bad", "audio": "%%"}),
        "invalid_audio",
        "audio",
    ),
    # issue 49: a lone surrogate closed the socket (its echo could not be encoded); JSON
    # nested deeper than the parser's recursion limit did too (RecursionError)
    (
        "lone surrogate",
        ga_input(transcription={"prompt": "caf\ud83d"}),
        "invalid_value",
        f"{GA_INPUT}.transcription.prompt",
    ),
    (
        "lone surrogate in a beta update",
        beta_update(input_audio_transcription={"keywords": ["ok", "\udc00"]}),
        "invalid_value",
        "session.input_audio_transcription.keywords.1",
    ),
    ("nested deep", "[" * 50000 + "]" * 50000, "invalid_json", None),
    ("objects nested deep", '{"a":' * 50000 + "1" + "}" * 50000, "invalid_json", None),
]


@pytest.mark.parametrize(
    ("text", "code", "param"),
    [case[1:] for case in REALTIME_BAD],
    ids=[case[0] for case in REALTIME_BAD],
)
def test_realtime_bad_event_gets_an_error_and_the_session_goes_on(
    server: LiveServer, text: str, code: str, param: str | None
) -> None:
    with realtime_ws(server) as ws:
        ws.send(text)
        event = next_event(ws)
        RealtimeErrorEvent.model_validate(event)  # the SDK's own type
        assert event["type"] == "error", event
        error = event["error"]
        assert (error["code"], error["param"]) == (code, param), error
        assert error["type"] == "invalid_request_error" and error["message"]
        assert error["event_id"] == ("evt_bad" if "evt_bad" in text else None)
        ws.send(json.dumps({"type": "input_audio_buffer.clear"}))  # the socket is still open
        assert next_event(ws)["type"] == "input_audio_buffer.cleared"


def test_realtime_unknown_fields_are_ignored_and_both_shapes_apply(server: LiveServer) -> None:
    with realtime_ws(server) as ws:
        ws.send(
            json.dumps(
                ga_update(
                    format={"type": "audio/pcm", "rate": 16000},
                    noise_reduction={"type": "near_field"},
                    transcription={"model": "gpt-4o-transcribe", "language": "en", "prompt": ""},
                    turn_detection={
                        "type": "server_vad",
                        "threshold": 0.7,
                        "silence_duration_ms": 800,
                        "prefix_padding_ms": 0,
                        "create_response": True,
                    },
                )
                | {"client_secret": None}
            )
        )
        updated = next_event(ws)
        assert updated["type"] == "session.updated", updated
        audio_in = updated["session"]["audio"]["input"]
        assert audio_in["format"] == {"type": "audio/pcm", "rate": 16000}
        assert audio_in["transcription"]["language"] == "en"
        assert audio_in["turn_detection"] == {
            "type": "server_vad",
            "threshold": 0.7,
            "prefix_padding_ms": 0,
            "silence_duration_ms": 800,
            "create_response": True,  # accepted and echoed; no responses are made
        }
        assert audio_in["noise_reduction"] == {"type": "near_field"}  # echoed, not applied
        assert audio_in["transcription"]["model"] == "gpt-4o-transcribe"
        beta = {
            "input_audio_format": "pcm16",
            "input_audio_transcription": {"model": "whisper-1", "language": None},
            "input_audio_noise_reduction": None,
            "include": ["item.input_audio_transcription.logprobs"],
            "turn_detection": None,
        }
        ws.send(json.dumps({"type": "transcription_session.update", "session": beta}))
        updated = next_event(ws)
        assert updated["type"] == "transcription_session.updated", updated
        assert updated["session"]["turn_detection"] is None
        assert updated["session"]["input_audio_transcription"]["language"] is None


def test_realtime_a_bad_update_changes_nothing(server: LiveServer) -> None:
    with realtime_ws(server) as ws:
        bad = ga_update(
            transcription={"language": "en"},
            turn_detection={"type": "server_vad", "threshold": 0.9},
            format={"type": "audio/pcm", "rate": "24k"},
        )
        ws.send(json.dumps(bad))
        assert next_event(ws)["error"]["param"] == f"{GA_INPUT}.format.rate"
        ws.send(json.dumps({"type": "session.update", "session": {}}))
        audio_in = next_event(ws)["session"]["audio"]["input"]
        assert audio_in["transcription"]["language"] is None
        assert audio_in["turn_detection"]["threshold"] == 0.5
        assert audio_in["format"]["rate"] == 24000


SERVER_VAD = {"type": "server_vad", "threshold": 0.7, "prefix_padding_ms": 300}


@pytest.fixture(scope="module")
def vad_server() -> Iterator[LiveServer]:
    """A server whose streaming VAD is not the default one."""
    settings = whisper_settings(ws_vad_threshold=0.7, ws_end_silence_ms=800)
    with live_server(create_app(settings)) as srv:
        yield srv


def open_sessions(server: LiveServer) -> list[Any]:
    return list(server.app.state.ctx.sessions._sessions)


def test_realtime_session_created_reports_the_vad_the_session_uses(
    vad_server: LiveServer,
) -> None:
    """session.created described a VAD of 0.5/500 ms whatever WS_VAD_THRESHOLD and
    WS_END_SILENCE_MS said (the session itself ran with the settings)."""
    url = vad_server.url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
    with connect(url, open_timeout=30) as ws:
        created = next_event(ws)
        assert created["type"] == "session.created"
        turn = created["session"]["audio"]["input"]["turn_detection"]
        assert turn == SERVER_VAD | {"silence_duration_ms": 800}
        [session] = open_sessions(vad_server)
        config = session.config
        assert (config.vad_threshold, config.end_silence_ms, config.prefix_padding_ms) == (
            0.7,
            800,
            300,
        )


def described(updated: dict[str, Any], shape: str) -> tuple[str | None, Any]:
    """The language and turn detection a session.updated (GA or beta) describes."""
    assert (
        updated["type"] == {"ga": "session.updated", "beta": "transcription_session.updated"}[shape]
    ), updated
    if shape == "ga":
        audio_in = updated["session"]["audio"]["input"]
        return audio_in["transcription"]["language"], audio_in["turn_detection"]
    beta = updated["session"]
    return beta["input_audio_transcription"]["language"], beta["turn_detection"]


def update(shape: str, language: str | None = None, turn: Any = None) -> str:
    if shape == "ga":
        fields: dict[str, Any] = {}
        if language is not None:
            fields["transcription"] = {"language": language}
        if turn is not None:
            fields["turn_detection"] = turn
        return json.dumps(ga_update(**fields))
    session: dict[str, Any] = {}
    if language is not None:
        session["input_audio_transcription"] = {"language": language}
    if turn is not None:
        session["turn_detection"] = turn
    return json.dumps({"type": "transcription_session.update", "session": session})


@pytest.mark.parametrize("shape", ["ga", "beta"])
def test_realtime_a_language_update_keeps_the_vad(vad_server: LiveServer, shape: str) -> None:
    """An update changes only what it sends: one with only the language reset the VAD
    (threshold, silence, prefix padding) to 0.5/500/300, in the session and its description."""
    url = vad_server.url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
    vad = SERVER_VAD | {"silence_duration_ms": 800, "prefix_padding_ms": 100}
    with connect(url, open_timeout=30) as ws:
        assert next_event(ws)["type"] == "session.created"
        ws.send(update(shape, turn={"type": "server_vad", "prefix_padding_ms": 100}))
        assert described(next_event(ws), shape) == (None, vad)
        ws.send(update(shape, language="en"))
        assert described(next_event(ws), shape) == ("en", vad)
        [session] = open_sessions(vad_server)  # the update was applied before it was answered
        config = session.config
        assert (config.language, config.use_vad) == ("en", True)
        assert (config.vad_threshold, config.end_silence_ms, config.prefix_padding_ms) == (
            0.7,
            800,
            100,
        )


def test_realtime_with_the_sdk_bad_events_then_a_transcript(server: LiveServer) -> None:
    """The openai SDK as the client: bad events are answered with ErrorEvents, and the same
    connection then transcribes speech."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        assert conn.recv().type == "session.created"
        bad_turn = {"type": "server_vad", "threshold": None}
        conn.send(ga_update(turn_detection=bad_turn) | {"event_id": "evt_1"})
        conn.send_raw(json.dumps(ga_update(format={"type": "audio/pcm", "rate": "24k"})))
        conn.send_raw(json.dumps({"type": "session.update", "session": [1]}))
        conn.send_raw(json.dumps(ga_update(transcription={"language": 7})))
        conn.send_raw("[]")
        errors = [conn.recv() for _ in range(5)]
        assert [e.type for e in errors] == ["error"] * 5
        assert errors[0].error.event_id == "evt_1"
        assert [e.error.param for e in errors] == [
            f"{GA_INPUT}.turn_detection.threshold",
            f"{GA_INPUT}.format.rate",
            "session",
            f"{GA_INPUT}.transcription.language",
            None,
        ]
        conn.session.update(
            session={
                "type": "transcription",
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcm", "rate": 16000},
                        "transcription": {"model": "whisper-1", "language": "en"},
                        "turn_detection": None,
                    }
                },
            }
        )
        assert conn.recv().type == "session.updated"
        audio = load("sentence_02.wav")
        for i in range(0, len(audio), 8000):
            conn.input_audio_buffer.append(
                audio=base64.b64encode(pcm16(audio[i : i + 8000])).decode()
            )
        conn.input_audio_buffer.commit()
        transcripts: list[str] = []

        def read() -> None:
            for event in conn:
                if event.type == "conversation.item.input_audio_transcription.completed":
                    transcripts.append(event.transcript)
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(30)
    assert transcripts and normalize(transcripts[0]).startswith("please call me back")


# --- /ws/transcribe ----------------------------------------------------------------------

TRANSCRIBE_BAD = [
    ("not json", "{action", "INVALID_JSON"),
    ("json list", "[1]", "INVALID_ACTION"),
    ("json number", "5", "INVALID_ACTION"),
    ("no action", "{}", "INVALID_ACTION"),
    ("action not a string", json.dumps({"action": ["flush"]}), "INVALID_ACTION"),
    ("unknown action", json.dumps({"action": "dance"}), "UNKNOWN_ACTION"),
    ("language a number", json.dumps({"action": "config", "language": 5}), "INVALID_VALUE"),
    ("language a list", json.dumps({"action": "config", "language": ["en"]}), "INVALID_VALUE"),
    (
        "vad not bool-ish",
        json.dumps({"action": "config", "use_server_vad": "maybe"}),
        "INVALID_VALUE",
    ),
    ("vad null", json.dumps({"action": "config", "use_server_vad": None}), "INVALID_VALUE"),
    ("vad a list", json.dumps({"action": "config", "use_server_vad": [True]}), "INVALID_VALUE"),
    (
        "language unknown",
        json.dumps({"action": "config", "language": "xx"}),
        "UNSUPPORTED_LANGUAGE",
    ),
    # issue 49: these closed the socket
    ("lone surrogate", json.dumps({"action": "config", "prompt": "caf\ud83d"}), "INVALID_VALUE"),
    (
        "lone surrogate in keywords",
        json.dumps({"action": "config", "keywords": ["\udc00"]}),
        "INVALID_VALUE",
    ),
    ("lone surrogate key", json.dumps({"action": "config", "\ud800": 1}), "INVALID_VALUE"),
    ("nested deep", "[" * 50000 + "]" * 50000, "INVALID_JSON"),
    ("objects nested deep", '{"a":' * 50000 + "1" + "}" * 50000, "INVALID_JSON"),
]


def wait_code(c: Collector, code: str) -> dict[str, Any]:
    assert c.wait_for(lambda c: any(m.get("code") == code for _, m in c.messages), 10), c.messages
    return next(m for _, m in c.messages if m.get("code") == code)


def wait_status(c: Collector, status: str, count: int = 1) -> dict[str, Any]:
    def seen(c: Collector) -> list[dict[str, Any]]:
        return [m for _, m in c.messages if m.get("status") == status]

    assert c.wait_for(lambda c: len(seen(c)) >= count, 10), c.messages
    return seen(c)[count - 1]


@pytest.mark.parametrize(
    ("text", "code"), [case[1:] for case in TRANSCRIBE_BAD], ids=[c[0] for c in TRANSCRIBE_BAD]
)
def test_transcribe_bad_action_gets_an_error_and_the_session_goes_on(
    server: LiveServer, text: str, code: str
) -> None:
    with open_ws(server.url) as ws:
        c = Collector(ws)
        wait_status(c, "connected")
        ws.send(text)
        error = wait_code(c, code)
        assert set(error) == {"code", "message", "statusCode"}
        assert error["statusCode"] == 400 and error["message"]
        ws.send(json.dumps({"action": "reset"}))
        wait_status(c, "buffer_reset")
        assert not c.closed.is_set()


@pytest.mark.parametrize(
    ("sent", "expected"),
    [("false", False), ("true", True), ("0", False), ("1", True), (False, False), (True, True)],
)
def test_transcribe_config_accepts_bool_ish_vad(
    server: LiveServer, sent: Any, expected: bool
) -> None:
    with open_ws(server.url, use_server_vad="true" if not expected else "false") as ws:
        c = Collector(ws)
        ws.send(json.dumps({"action": "config", "use_server_vad": sent, "extra": {"x": 1}}))
        assert wait_status(c, "configured")["use_server_vad"] is expected


def test_transcribe_audio_after_a_bad_action_is_still_transcribed(server: LiveServer) -> None:
    with open_ws(server.url, use_server_vad="false") as ws:
        c = Collector(ws)
        ws.send(json.dumps({"action": "config", "language": {"code": "en"}}))
        wait_code(c, "INVALID_VALUE")
        audio = load("sentence_02.wav")
        for i in range(0, len(audio), 16000):
            ws.send(pcm16(audio[i : i + 16000]))
        ws.send(pcm16(np.zeros(1600, np.float32)))
        ws.send(json.dumps({"action": "flush"}))
        assert c.wait_for(lambda c: c.finals(), 30)
    assert normalize(c.finals()[0]).startswith("please call me back")


MANY_KEYWORDS = [f"w{i}" for i in range(100_000)]  # ~0.9 MB of JSON: under the frame limit


@pytest.mark.parametrize("route", ["realtime", "ws_transcribe"])
def test_a_message_with_many_keywords_is_refused_at_once(server: LiveServer, route: str) -> None:
    """Issue 58 §7.1: the keywords were deduplicated by list lookup on the event loop before
    the 100-keyword limit, so one message with 100,000 of them froze every route, /health
    included, for over a minute. Now the error comes at once and /health answers."""
    if route == "realtime":
        ws = realtime_ws(server)
        transcription = {"model": "whisper-1", "keywords": MANY_KEYWORDS}
        ws.send(json.dumps(ga_update(transcription=transcription)))
    else:
        ws = open_ws(server.url)
        assert json.loads(ws.recv(timeout=10))["status"] == "connected"
        ws.send(json.dumps({"action": "config", "keywords": MANY_KEYWORDS}))
    with ws:
        health = httpx.get(server.url + "/health", timeout=15)  # the loop is not stalled
        assert health.status_code == 200
        reply = json.loads(ws.recv(timeout=15))
        text = json.dumps(reply)
        assert "keywords" in text and "100" in text, reply
        ws.send(json.dumps({"action": "reset"} if route != "realtime" else ga_update()))
        assert json.loads(ws.recv(timeout=15))  # the connection stays open


def test_check_keywords_is_linear_and_stops_at_the_limit() -> None:
    from qwen3_asr_server.errors import BadRequestError
    from qwen3_asr_server.transcription.decoding import MAX_KEYWORDS, check_keywords

    assert check_keywords([" a  b ", "a b", "", "c", "a b"]) == ("a b", "c")
    assert len(check_keywords(["x"] * 1_000_000)) == 1  # duplicates: linear, not refused
    with pytest.raises(BadRequestError, match=f"At most {MAX_KEYWORDS}"):
        check_keywords(f"w{i}" for i in range(10**9))  # stops at the first one too many
