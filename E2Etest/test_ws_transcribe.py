"""WS /ws/transcribe, the seed's real-time protocol: connect, PCM in, partials and finals
out, the flush/reset/config actions and the error events."""

from __future__ import annotations

import json
from typing import Any

import pytest
from e2e_support import (
    API_KEY,
    WER_BOUND,
    Clip,
    Messages,
    normalize,
    send_pcm,
    streamable,
    wer,
    ws_connect,
)

pytestmark = pytest.mark.websocket

PATH = "/ws/transcribe"


@pytest.fixture(scope="module")
def ws_clip(clip: Clip, warm: None) -> Clip:
    return streamable(clip, (8000, 16000))


def connected(messages: Messages) -> dict[str, Any]:
    assert messages.wait_for(lambda m: m.items, 30), "no connected message"
    first = messages.items[0]
    assert first["status"] == "connected", first
    return first


def action(ws: Any, name: str, **fields: Any) -> None:
    ws.send(json.dumps({"action": name, **fields}))


@pytest.mark.smoke
def test_connect_stream_and_flush_gives_a_final(ws_clip: Clip) -> None:
    query = {"sample_rate": ws_clip.rate, "use_server_vad": "false"}
    with ws_connect(PATH, **query) as ws:
        m = Messages(ws)
        first = connected(m)
        assert first["sample_rate"] == ws_clip.rate
        assert first["format"] == "pcm_s16le"
        assert first["use_server_vad"] is False
        assert isinstance(first["buffer_size"], int) and first["buffer_size"] > 0
        assert first["window_max_s"] > 0
        send_pcm(ws, ws_clip.pcm, ws_clip.rate, speed=4)
        action(ws, "flush")
        assert m.wait_for(lambda m: m.finals()), m.items
    final = m.finals()[0]
    assert final["is_partial"] is False
    assert len(m.finals()) == 1, "without server VAD, one final per flush"
    assert wer([ws_clip.transcript], [final["text"]]) < WER_BOUND, final


def test_partials_then_a_final_at_real_time_pace(ws_clip: Clip) -> None:
    with ws_connect(PATH, sample_rate=ws_clip.rate, language="en") as ws:
        m = Messages(ws)
        assert connected(m)["use_server_vad"] is True, "server VAD is the default"
        send_pcm(ws, ws_clip.pcm_with_silence(1.5), ws_clip.rate, speed=1.0)
        assert m.wait_for(lambda m: m.finals()), m.items
    partials = m.partials()
    assert partials, "no partial while speaking"
    first_final = m.items.index(m.finals()[0])
    assert m.items.index(partials[0]) < first_final, "partials come before the final"
    for p in partials:
        assert p["is_final"] is False and isinstance(p["text"], str), p
        if p.get("stable_text"):  # the settled prefix of the hypothesis
            assert normalize(p["text"]).startswith(normalize(p["stable_text"])), p
    text = " ".join(f["text"] for f in m.finals())
    assert wer([ws_clip.transcript], [text]) < WER_BOUND, m.finals()


def test_pauses_end_utterances_with_server_vad(multi_clip: Clip, warm: None) -> None:
    clip = streamable(multi_clip, (8000, 16000))
    with ws_connect(PATH, sample_rate=clip.rate, language="en") as ws:
        m = Messages(ws)
        connected(m)
        send_pcm(ws, clip.pcm_with_silence(1.5), clip.rate, speed=2.0)
        assert m.wait_for(lambda m: len(m.finals()) >= 2), m.items
        seen = len(m.finals())
        # Finals come in order and a flush is answered with one (maybe empty): once one more
        # final has come, every utterance before the flush has been delivered.
        action(ws, "flush")
        assert m.wait_for(lambda m: len(m.finals()) > seen), m.items
    texts = [f["text"] for f in m.finals() if f["text"].strip()]
    assert len(texts) >= 2, f"1 s pauses end utterances: {texts}"
    assert wer([clip.transcript], [" ".join(texts)]) < WER_BOUND, texts


def test_reset_finalizes_and_acknowledges(ws_clip: Clip) -> None:
    with ws_connect(PATH, sample_rate=ws_clip.rate, use_server_vad="false") as ws:
        m = Messages(ws)
        connected(m)
        send_pcm(ws, ws_clip.pcm, ws_clip.rate, speed=8)
        action(ws, "reset")
        assert m.wait_for(lambda m: m.with_status("buffer_reset")), m.items
        assert m.wait_for(lambda m: m.finals()), "the buffered audio still gets its final"
    assert wer([ws_clip.transcript], [m.finals()[0]["text"]]) < WER_BOUND


def test_flush_with_nothing_buffered_answers_an_empty_final(ws_clip: Clip) -> None:
    with ws_connect(PATH, sample_rate=ws_clip.rate) as ws:
        m = Messages(ws)
        connected(m)
        action(ws, "flush")
        assert m.wait_for(lambda m: m.finals()), m.items
    assert m.finals()[0]["text"] == ""


def test_config_action(ws_clip: Clip) -> None:
    with ws_connect(PATH, sample_rate=ws_clip.rate) as ws:
        m = Messages(ws)
        connected(m)
        action(ws, "config", language="en", use_server_vad=False)
        assert m.wait_for(lambda m: m.with_status("configured")), m.items
        reply = m.with_status("configured")[0]
        assert reply["language"] == "en" and reply["use_server_vad"] is False
        send_pcm(ws, ws_clip.pcm, ws_clip.rate, speed=8)  # no VAD now: only flush ends it
        action(ws, "flush")
        assert m.wait_for(lambda m: m.finals()), m.items
    assert len(m.finals()) == 1
    assert wer([ws_clip.transcript], [m.finals()[0]["text"]]) < WER_BOUND


def test_bad_messages_get_error_events_and_the_session_goes_on(ws_clip: Clip) -> None:
    with ws_connect(PATH, sample_rate=ws_clip.rate) as ws:
        m = Messages(ws)
        connected(m)
        action(ws, "dance")
        ws.send("this is not json")
        ws.send(json.dumps({"no_action": True}))
        action(ws, "config", use_server_vad="maybe")
        assert m.wait_for(lambda m: len(m.errors()) >= 4), m.items
        action(ws, "flush")  # still open and answering
        assert m.wait_for(lambda m: m.finals()), m.items
    codes = [e["code"] for e in m.errors()]
    assert codes == ["UNKNOWN_ACTION", "INVALID_JSON", "INVALID_ACTION", "INVALID_VALUE"]
    for error in m.errors():
        assert error["statusCode"] == 400 and error["message"], error


def test_unsupported_sample_rate_is_refused() -> None:
    with ws_connect(PATH, sample_rate=44100) as ws:
        m = Messages(ws)
        assert m.wait_for(lambda m: m.errors(), 30), m.items
        assert m.errors()[0]["code"] == "UNSUPPORTED_SAMPLE_RATE"
        assert m.closed.wait(30), "the socket is closed after the error"


needs_key = pytest.mark.skipif(
    not API_KEY, reason="E2E_API_KEY is not set (set it when the deployment has API_KEY)"
)


@needs_key
def test_auth(ws_clip: Clip) -> None:
    with ws_connect(PATH, key=None) as ws:
        m = Messages(ws)
        assert m.wait_for(lambda m: m.errors(), 30), m.items
        assert m.errors()[0]["code"] == "UNAUTHORIZED"
        assert m.closed.wait(30)
    assert isinstance(ws.close_code, int) and ws.close_code == 1008
    with ws_connect(PATH, key=None, api_key=API_KEY) as ws:  # ?api_key=, as a browser does
        assert json.loads(ws.recv(timeout=30))["status"] == "connected"
    subprotocols = ["openai-insecure-api-key." + str(API_KEY)]
    with ws_connect(PATH, key=None, subprotocols=subprotocols) as ws:
        assert json.loads(ws.recv(timeout=30))["status"] == "connected"
    with ws_connect(PATH, key="wrong-key") as ws:
        m = Messages(ws)
        assert m.wait_for(lambda m: m.errors(), 30), m.items
        assert m.errors()[0]["code"] == "UNAUTHORIZED"
