"""/v1/realtime session fields of the GA transcription session (issue 31): decoding fields
reach the engine, logprobs and languages on `completed`, the idle timeout, delay and
eagerness as end-of-speech silence, G.711 and beta shapes, each event validated as the
openai SDK's own types."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from openai.types.beta.realtime import TranscriptionSessionUpdatedEvent
from openai.types.realtime import SessionCreatedEvent, SessionUpdatedEvent

from contract import check_realtime_event
from engines import Capturing
from helpers import whisper_settings
from qwen3_asr_server.app import create_app
from qwen3_asr_server.engines import create_engine
from realtime_client import client_for, collect, completed, encode, of_type, send
from server import LiveServer, live_server
from streaming_client import load
from wer import normalize

pytestmark = pytest.mark.slow
SETTINGS = whisper_settings()
LOGPROBS = "item.input_audio_transcription.logprobs"


@pytest.fixture(scope="module")
def engine() -> Capturing:
    return Capturing(create_engine(SETTINGS))


@pytest.fixture(scope="module")
def server(engine: Capturing) -> Iterator[LiveServer]:
    with live_server(create_app(SETTINGS, engine=engine)) as srv:  # type: ignore[arg-type]
        yield srv


def only_session(server: LiveServer) -> Any:
    """The newest session: this test's open one (earlier tests' may still be finishing)."""
    return list(server.app.state.ctx.sessions._sessions)[-1]


def update(conn: Any, **audio_input: Any) -> Any:
    """A GA session.update; the session.updated it gets, validated strictly."""
    session: dict[str, Any] = {"type": "transcription", "audio": {"input": audio_input}}
    if "include" in audio_input:
        session["include"] = audio_input.pop("include")
    conn.session.update(session=session)
    raw = conn.recv_bytes()
    event = SessionUpdatedEvent.model_validate_json(raw)
    assert event.type == "session.updated", raw
    return json.loads(raw)["session"]


def test_transcription_fields_reach_every_decode_and_completed_carries_them(
    server: LiveServer, engine: Capturing
) -> None:
    with client_for(server).realtime.connect(extra_query={"intent": "transcription"}) as conn:
        SessionCreatedEvent.model_validate_json(conn.recv_bytes())
        described = update(
            conn,
            include=[LOGPROBS],
            noise_reduction={"type": "far_field", "strength": 0.5},
            transcription={
                "model": "gpt-realtime-whisper",
                "language": "en",
                "keywords": ["Fox Jumps"],
                "delay": "high",
            },
            turn_detection={"type": "server_vad", "idle_timeout_ms": 30000},
        )
        assert described["include"] == [LOGPROBS]
        audio_in = described["audio"]["input"]
        assert audio_in["noise_reduction"] == {"type": "far_field", "strength": 0.5}
        assert audio_in["transcription"] == {
            "model": "gpt-realtime-whisper",
            "language": "en",
            "keywords": ["Fox Jumps"],
            "delay": "high",
        }
        assert audio_in["turn_detection"]["silence_duration_ms"] == 800  # delay high
        assert audio_in["turn_detection"]["idle_timeout_ms"] == 30000
        config = only_session(server).config
        assert (config.end_silence_ms, config.idle_timeout_ms) == (800, 30000)
        assert config.decoding.keywords == ("Fox Jumps",) and config.decoding.logprobs
        engine.requests.clear()
        audio = np.concatenate([load("sentence_01.wav"), np.zeros(16000, np.float32)])
        data, chunk = encode(audio, "pcm24")
        sender = threading.Thread(target=send, args=(conn, data, chunk, 4.0))
        sender.start()
        events = collect(conn, lambda ev: completed(ev))
        sender.join()
    [final] = completed(events)
    # whisper tiny.en hears "round fox" here; the keywords make it "Fox Jumps"
    assert "fox jumps" in normalize(final.transcript), final.transcript
    assert [lang.code for lang in final.languages or []] == ["en"]
    assert final.usage.type in ("duration", "tokens")
    logprobs = final.logprobs or []
    assert logprobs and all(t.logprob <= 0 for t in logprobs)
    assert normalize("".join(t.token for t in logprobs)) == normalize(final.transcript)
    assert all(t.bytes == list(t.token.encode()) for t in logprobs)
    # every decode (partials and the final) had the keywords and asked for logprobs
    assert engine.requests and all(r.keywords == ("Fox Jumps",) for r in engine.requests)
    assert all(r.logprobs for r in engine.requests)


def test_deltas_carry_the_logprobs_of_their_tokens(server: LiveServer) -> None:
    """With `include` logprobs, each delta carries the tokens (of the partial that made it
    stable) that begin inside its text: values <= 0 that spell the delta."""
    events: list[Any] = []
    with client_for(server).realtime.connect(extra_query={"intent": "transcription"}) as conn:
        conn.recv()
        update(conn, include=[LOGPROBS], transcription={"language": "en"})
        # three_sentences.wav's sentences one at a time, until one of them has had deltas
        # (whether partials agree before a sentence's final varies with the machine's load):
        # each slower than the last (half, a quarter, an eighth of real-time pace), so that on
        # a busy machine partials still have time to agree and deltas come before the final
        paces = {"sentence_02.wav": 0.5, "sentence_01.wav": 0.25, "sentence_03.wav": 0.125}
        for name, pace in paces.items():
            audio = np.concatenate([load(name), np.zeros(16000, np.float32)])
            data, chunk = encode(audio, "pcm24")
            sender = threading.Thread(target=send, args=(conn, data, chunk, pace))
            sender.start()
            events += collect(conn, lambda ev: len(completed(ev)) >= 1)
            sender.join()
            if of_type(events, "transcription.delta"):
                break
    assert len(completed(events)) >= 1, [e.type for e in events]
    deltas = of_type(events, "transcription.delta")
    assert deltas, [e.type for e in events]
    for delta in deltas:
        check_realtime_event(delta.model_dump_json(exclude_none=True))
        tokens = delta.logprobs
        assert tokens is not None and all(t.logprob <= 0 for t in tokens), delta
        spelled = normalize("".join(t.token for t in tokens))
        assert not spelled or spelled in normalize(delta.delta), (spelled, delta.delta)
    assert any(delta.logprobs for delta in deltas)


def test_idle_timeout_commits_an_empty_item(server: LiveServer) -> None:
    with client_for(server).realtime.connect(extra_query={"intent": "transcription"}) as conn:
        conn.recv()
        turn = {"type": "server_vad", "idle_timeout_ms": 1000}
        assert update(conn, turn_detection=turn)["audio"]["input"]["turn_detection"] == {
            "type": "server_vad",
            "threshold": 0.5,
            "prefix_padding_ms": 300,
            "silence_duration_ms": 500,
            "idle_timeout_ms": 1000,
        }
        data, chunk = encode(np.zeros(int(16000 * 1.6), np.float32), "pcm24")
        send(conn, data, chunk, speed=8.0)
        events = collect(conn, lambda ev: completed(ev), timeout=30)
    kinds = [e.type for e in events]
    assert kinds == [
        "input_audio_buffer.timeout_triggered",
        "input_audio_buffer.committed",
        "conversation.item.input_audio_transcription.completed",
    ], kinds
    timeout, committed, final = events
    assert timeout.item_id == committed.item_id == final.item_id
    assert abs((timeout.audio_end_ms - timeout.audio_start_ms) - 1000) <= 40
    assert final.transcript == "" and final.usage.seconds == 0


def speech_stop_delay(server: LiveServer, turn: dict[str, Any], **transcription: Any) -> int:
    """ms between the end of a sentence's audio and the speech_stopped it causes."""
    audio = load("sentence_03.wav")
    with client_for(server).realtime.connect(extra_query={"intent": "transcription"}) as conn:
        conn.recv()
        fields: dict[str, Any] = {"turn_detection": turn}
        if transcription:
            fields["transcription"] = transcription
        update(conn, **fields)
        data, chunk = encode(np.concatenate([audio, np.zeros(32000, np.float32)]), "pcm24")
        send(conn, data, chunk, speed=8.0)
        events = collect(conn, lambda ev: of_type(ev, "speech_stopped"), timeout=30)
    [stopped] = of_type(events, "speech_stopped")
    return int(stopped.audio_end_ms - len(audio) * 1000 // 16000)


def test_eagerness_and_delay_set_how_long_the_session_waits(server: LiveServer) -> None:
    eager = speech_stop_delay(server, {"type": "semantic_vad", "eagerness": "high"})
    patient = speech_stop_delay(server, {"type": "semantic_vad", "eagerness": "low"})
    assert 800 <= patient - eager <= 1000, (eager, patient)  # 300 ms against 1200 ms
    minimal = speech_stop_delay(server, {"type": "server_vad"}, delay="minimal")
    xhigh = speech_stop_delay(server, {"type": "server_vad"}, delay="xhigh")
    assert 900 <= xhigh - minimal <= 1100, (minimal, xhigh)  # 200 ms against 1200 ms


def test_semantic_vad_and_an_explicit_silence_are_described(server: LiveServer) -> None:
    with client_for(server).realtime.connect(extra_query={"intent": "transcription"}) as conn:
        conn.recv()
        turn = {"type": "semantic_vad", "eagerness": "low", "interrupt_response": False}
        described = update(conn, turn_detection=turn)["audio"]["input"]["turn_detection"]
        assert described["type"] == "semantic_vad" and described["eagerness"] == "low"
        assert described["silence_duration_ms"] == 1200
        assert described["interrupt_response"] is False
        # silence_duration_ms wins over the delay sent in the same update
        audio_in = update(
            conn,
            transcription={"delay": "xhigh"},
            turn_detection={"type": "server_vad", "silence_duration_ms": 700},
        )["audio"]["input"]
        assert audio_in["turn_detection"]["silence_duration_ms"] == 700
        assert only_session(server).config.end_silence_ms == 700


@pytest.mark.parametrize(("fmt", "law"), [("g711_ulaw", "audio/pcmu"), ("g711_alaw", "audio/pcma")])
def test_beta_and_ga_g711_formats_are_accepted_and_described(
    server: LiveServer, fmt: str, law: str
) -> None:
    with client_for(server).realtime.connect(extra_query={"intent": "transcription"}) as conn:
        conn.recv()
        beta = {
            "input_audio_format": fmt,
            "input_audio_noise_reduction": {"type": "near_field"},
            "input_audio_transcription": {"model": "gpt-4o-transcribe", "prompt": "Fox."},
            "include": [LOGPROBS],
        }
        conn.send({"type": "transcription_session.update", "session": beta})  # type: ignore[arg-type]
        raw = conn.recv_bytes()
        event = TranscriptionSessionUpdatedEvent.model_validate_json(raw)  # the SDK's type
        assert event.session.client_secret.value == ""  # no secret opened this session
        session = json.loads(raw)["session"]
        assert session["input_audio_format"] == fmt
        assert session["input_audio_noise_reduction"] == {"type": "near_field"}
        assert session["input_audio_transcription"]["prompt"] == "Fox."
        assert session["include"] == [LOGPROBS]
        assert only_session(server).config.decoding.prompt == "Fox."
        ga = update(conn)["audio"]["input"]  # the GA description of the same session
        assert ga["format"] == {"type": law}
        assert ga["transcription"]["model"] == "gpt-4o-transcribe"


def test_session_created_validates_and_describes_the_defaults(server: LiveServer) -> None:
    with client_for(server).realtime.connect(extra_query={"intent": "transcription"}) as conn:
        raw = conn.recv_bytes()
    created = SessionCreatedEvent.model_validate_json(raw)
    check_realtime_event(raw)
    session = json.loads(raw)["session"]
    assert created.session.type == "transcription"
    assert session["include"] == []
    assert session["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert session["audio"]["input"]["noise_reduction"] is None


def test_qwen_completed_carries_token_usage_and_logprobs(qwen_settings: Any) -> None:
    """On the tiny Qwen checkpoint (random weights: the text is noise, the shapes are real)
    a final's usage is the engine's token count, and `include` brings its logprobs."""
    settings = qwen_settings()
    engine = Capturing(create_engine(settings))
    app = create_app(settings, engine=engine)  # type: ignore[arg-type]
    with (
        live_server(app) as srv,
        client_for(srv).realtime.connect(extra_query={"intent": "transcription"}) as conn,
    ):
        conn.recv()
        update(
            conn,
            include=[LOGPROBS],
            transcription={"prompt": "Names.", "keywords": ["Qwen"]},
            turn_detection=None,
        )
        data, chunk = encode(load("sentence_02.wav")[:16000], "pcm24")
        send(conn, data, chunk, speed=20.0)
        conn.input_audio_buffer.commit()
        events = collect(conn, lambda ev: completed(ev), timeout=120)
    [final] = completed(events)
    assert final.usage.type == "tokens", final.usage
    details = final.usage.input_token_details
    assert details is not None and (details.audio_tokens or 0) > 0
    assert final.usage.total_tokens == final.usage.input_tokens + final.usage.output_tokens
    assert final.logprobs is not None and all(t.logprob <= 0 for t in final.logprobs)
    [request] = [r for r in engine.requests if not r.partial]
    assert (request.prompt, request.keywords, request.logprobs) == ("Names.", ("Qwen",), True)


def test_delta_tokens_are_placed_by_characters_not_by_spacing_or_bytes() -> None:
    """CJK text spaced apart from Latin, and tokens that each hold half a character: each
    token goes with the delta its character begins in."""
    from qwen3_asr_server.api.openai.realtime_wire import tokens_within
    from qwen3_asr_server.transcript import TokenLogprob

    def token(text: str, raw: bytes | None = None) -> TokenLogprob:
        return TokenLogprob(text, -0.1, tuple(raw if raw is not None else text.encode()))

    zh = tuple(token(t) for t in ("我们", "的", "API", "很", "好"))
    text = "我们的 API 很好"
    cut = len("我们的 API")
    assert [t.token for t in tokens_within(zh, text, 0, cut)] == ["我们", "的", "API"]
    assert [t.token for t in tokens_within(zh, text, cut, len(text))] == ["很", "好"]
    e = "é".encode()
    split = (token(" caf"), token("\ufffd", e[:1]), token("\ufffd", e[1:]), token(" au"))
    assert len(tokens_within(split, "café au", 0, 4)) == 3
    assert [t.token for t in tokens_within(split, "café au", 4, 7)] == [" au"]
