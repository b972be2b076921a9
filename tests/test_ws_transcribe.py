"""/ws/transcribe (the seed protocol) with real speech on the whisper engine."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import soxr

import speech
from engines import Recording
from helpers import whisper_settings
from qwen3_asr_server.app import create_app
from qwen3_asr_server.engines import create_engine
from server import LiveServer, live_server
from streaming_client import Collector, load, open_ws, stream
from wer import normalize, wer

pytestmark = pytest.mark.slow
# Measured: streamed finals on the 12 sentences, WER ~0.2 like the offline path (the same
# model and whole-utterance audio); the bound leaves room for VAD cut differences.
WER_BOUND = 0.3


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(create_app(whisper_settings())) as srv:
        yield srv


def connected(collector: Collector) -> dict[str, Any]:
    assert collector.wait_for(lambda c: c.messages)
    return collector.messages[0][1]


def test_connected_message(server: LiveServer) -> None:
    with open_ws(server.url, sample_rate="8000", use_server_vad="false") as ws:
        first = json.loads(ws.recv(timeout=10))
    assert first == {
        "status": "connected",
        "sample_rate": 8000,
        "format": "pcm_s16le",
        "buffer_size": int(0.45 * 8000) * 2,
        "window_max_s": 15.0,
        "use_server_vad": False,
    }
    # G.711 has one byte a sample: buffer_size is bytes (issue 49: it was twice that)
    for encoding in ("mulaw", "alaw"):
        with open_ws(server.url, sample_rate="8000", encoding=encoding) as ws:
            first = json.loads(ws.recv(timeout=10))
        assert (first["format"], first["buffer_size"]) == (encoding, int(0.45 * 8000))


def test_three_utterances_at_real_time_pace_give_three_finals(server: LiveServer) -> None:
    audio = load("three_sentences.wav")
    with open_ws(server.url) as ws:
        c = Collector(ws)
        stream(ws, np.concatenate([audio, np.zeros(16000, np.float32)]), speed=1.0)
        assert c.wait_for(lambda c: len(c.finals()) >= 3, timeout=20), c.messages
        # a flush with nothing buffered answers an empty final after every earlier one:
        # no final can still be on its way once it is here
        ws.send(json.dumps({"action": "flush"}))
        assert c.wait_for(lambda c: "" in c.finals(), timeout=20), c.messages
    assert c.finals()[3:] == [""], c.finals()
    finals = c.finals()[:3]
    refs = speech.transcripts()
    assert wer([refs["three_sentences.wav"]], [" ".join(finals)]) < WER_BOUND
    assert normalize(finals[1]).startswith("please call")
    partials = c.partials()
    assert partials, "no partials while speaking"
    assert all("stable_text" in p for p in partials)


def test_faster_than_real_time_finals_match_the_offline_transcripts(server: LiveServer) -> None:
    refs, hyps = [], []
    for name, ref in sorted(speech.sentences().items())[:6]:
        with open_ws(server.url) as ws:
            c = Collector(ws)
            stream(ws, np.concatenate([load(name), np.zeros(12000, np.float32)]), speed=4.0)
            assert c.wait_for(lambda c: c.finals(), timeout=20)
        refs.append(ref)
        hyps.append(" ".join(c.finals()))
    assert wer(refs, hyps) < WER_BOUND, list(zip(refs, hyps, strict=True))


def test_8_khz_telephony_input_is_resampled(server: LiveServer) -> None:
    audio8k = soxr.resample(load("sentence_02.wav"), 16000, 8000).astype(np.float32)
    with open_ws(server.url, sample_rate="8000") as ws:
        c = Collector(ws)
        stream(ws, np.concatenate([audio8k, np.zeros(6000, np.float32)]), rate=8000, speed=4)
        assert c.wait_for(lambda c: c.finals(), timeout=20)
    # tiny.en hears the band-limited espeak voice roughly ("please call me mac when you get
    # home to hide", beam 5); 8 kHz taken as 16 kHz (double speed) gives nothing like it
    final = " ".join(c.finals())
    assert normalize(final).startswith("please call me"), final
    assert wer([speech.sentences()["sentence_02.wav"]], [final]) < 0.4, final


def test_flush_without_server_vad(server: LiveServer) -> None:
    with open_ws(server.url, use_server_vad="false") as ws:
        c = Collector(ws)
        stream(ws, load("three_sentences.wav"), speed=8.0)
        ws.send(json.dumps({"action": "flush"}))
        assert c.wait_for(lambda c: c.finals(), timeout=20)
    # no VAD: pauses do not end utterances, so the first final (finals come in order) is
    # the flush's, with all three sentences
    assert len(c.finals()) == 1, c.finals()
    text = normalize(c.finals()[0])
    assert text.startswith("the quick") and text.endswith("some rain")


def test_flush_with_nothing_buffered_still_answers(server: LiveServer) -> None:
    with open_ws(server.url) as ws:
        c = Collector(ws)
        ws.send(json.dumps({"action": "flush"}))
        assert c.wait_for(lambda c: c.finals() == [""], timeout=10)


def answers(c: Collector) -> list[str]:
    """Finals and buffer_reset acknowledgements, in the order they came."""
    return [
        "reset" if m.get("status") == "buffer_reset" else f"final:{m['text']}"
        for _, m in c.messages
        if m.get("status") == "buffer_reset" or m.get("is_final")
    ]


def test_reset_finalizes_and_acknowledges_after_the_final(server: LiveServer) -> None:
    """The buffered audio gets its final first, then buffer_reset (issue 41: buffer_reset was
    sent at once and overtook the final)."""
    with open_ws(server.url, use_server_vad="false") as ws:
        c = Collector(ws)
        stream(ws, load("sentence_09.wav"), speed=8.0)
        ws.send(json.dumps({"action": "reset"}))
        assert c.wait_for(lambda c: "reset" in answers(c), timeout=20), c.messages
    got = answers(c)
    assert len(got) == 2 and got[1] == "reset", got
    assert normalize(got[0].removeprefix("final:")).startswith("the children")


def test_reset_with_nothing_buffered_is_answered_by_buffer_reset_alone(
    server: LiveServer,
) -> None:
    """As the old server: its clients send reset and read exactly one message, which must
    be buffer_reset (issue 49: an empty final came first). A flush after it is still
    answered by a final, so the reply to the resets is complete when it arrives."""
    with open_ws(server.url) as ws:
        json.loads(ws.recv(timeout=10))  # connected
        ws.send(json.dumps({"action": "reset"}))
        assert json.loads(ws.recv(timeout=10)) == {"status": "buffer_reset"}  # the old client
        c = Collector(ws)
        ws.send(json.dumps({"action": "reset"}))
        ws.send(json.dumps({"action": "flush"}))
        assert c.wait_for(lambda c: c.finals(), timeout=10), c.messages
    assert answers(c) == ["reset", "final:"]


def test_odd_sized_messages_give_the_same_final(server: LiveServer) -> None:
    """A byte stream may be cut anywhere: messages of 3201 bytes transcribe as 3200 do
    (issue 41: each odd byte was dropped and every later sample misaligned), at 16 and at
    8 kHz."""
    for rate in (16000, 8000):
        audio = soxr.resample(load("sentence_02.wav"), 16000, rate).astype(np.float32)
        data = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
        finals = []
        for size in (3200, 3201):
            with open_ws(server.url, sample_rate=str(rate), use_server_vad="false") as ws:
                c = Collector(ws)
                for i in range(0, len(data), size):
                    ws.send(data[i : i + size])
                ws.send(json.dumps({"action": "flush"}))
                assert c.wait_for(lambda c: c.finals(), timeout=30)
            finals.append(" ".join(c.finals()))
        assert finals[0] == finals[1], (rate, finals)
        assert normalize(finals[1]).startswith("please call me"), finals


def configured(c: Collector, count: int) -> dict[str, Any]:
    def replies(c: Collector) -> list[dict[str, Any]]:
        return [m for _, m in c.messages if m.get("status") == "configured"]

    assert c.wait_for(lambda c: len(replies(c)) >= count, 10), c.messages
    return replies(c)[count - 1]


def test_config_action(server: LiveServer) -> None:
    with open_ws(server.url) as ws:
        c = Collector(ws)
        ws.send(json.dumps({"action": "config", "language": "en", "use_server_vad": False}))
        reply = configured(c, 1)
        assert reply["language"] == "en" and reply["use_server_vad"] is False
        ws.send(json.dumps({"action": "config", "language": "fr"}))  # tiny.en: English only
        assert c.wait_for(
            lambda c: any(m.get("code") == "UNSUPPORTED_LANGUAGE" for _, m in c.messages)
        )


def test_config_echoes_the_language_as_the_seed_did(server: LiveServer) -> None:
    """`auto` when auto or unset, otherwise the language as sent (not the resolved code)."""
    with open_ws(server.url) as ws:
        c = Collector(ws)
        sent: list[dict[str, Any]] = [
            {"use_server_vad": True},  # language never set
            {"language": "auto"},
            {"language": "English"},
            {"use_server_vad": False},  # keeps the language sent before
            {"language": None},
            {"language": "EN"},
            {"language": ""},
        ]
        for i, fields in enumerate(sent, start=1):
            ws.send(json.dumps({"action": "config", **fields}))
            configured(c, i)
    echoed = [m["language"] for _, m in c.messages if m.get("status") == "configured"]
    assert echoed == ["auto", "auto", "English", "English", "auto", "EN", "auto"]
    with open_ws(server.url, language="en") as ws:  # the query's language counts as sent
        c = Collector(ws)
        ws.send(json.dumps({"action": "config", "use_server_vad": False}))
        assert configured(c, 1) == {
            "status": "configured",
            "language": "en",
            "use_server_vad": False,
            "prompt": None,
            "keywords": [],
        }


@pytest.mark.parametrize(
    ("payload", "code"),
    [("{not json", "INVALID_JSON"), (json.dumps({"action": "dance"}), "UNKNOWN_ACTION")],
)
def test_bad_actions(server: LiveServer, payload: str, code: str) -> None:
    with open_ws(server.url) as ws:
        c = Collector(ws)
        ws.send(payload)
        assert c.wait_for(lambda c: any(m.get("code") == code for _, m in c.messages))
        error = next(m for _, m in c.messages if m.get("code") == code)
        assert error["statusCode"] == 400 and error["message"]


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ({"sample_rate": "44100"}, "UNSUPPORTED_SAMPLE_RATE"),
        ({"sample_rate": "abc"}, "UNSUPPORTED_SAMPLE_RATE"),
        ({"language": "xx"}, "UNSUPPORTED_LANGUAGE"),
    ],
)
def test_bad_connect_parameters(server: LiveServer, query: dict[str, str], code: str) -> None:
    with open_ws(server.url, **query) as ws:
        assert json.loads(ws.recv(timeout=10))["code"] == code


def test_limits() -> None:
    settings = whisper_settings(
        ws_max_sessions=1, ws_max_frame_bytes=4096, ws_idle_timeout=1.5, ws_max_session_s=2
    )
    with live_server(create_app(settings)) as srv:
        with open_ws(srv.url) as first:
            c = Collector(first)
            connected(c)
            with open_ws(srv.url) as second:  # one session at a time
                assert json.loads(second.recv(timeout=10))["code"] == "TOO_MANY_SESSIONS"
            first.send(b"\x00" * 8192)
            assert c.wait_for(
                lambda c: any(m.get("code") == "FRAME_TOO_LARGE" for _, m in c.messages)
            )
            for _ in range(30):  # 3 s of audio in allowed frames: over WS_MAX_SESSION_S
                first.send(b"\x00" * 3200)
            assert c.wait_for(
                lambda c: any(m.get("code") == "SESSION_TOO_LONG" for _, m in c.messages)
            )
            assert c.closed.wait(10)
        with open_ws(srv.url) as idle:  # the slot is free again; now say nothing
            c = Collector(idle)
            assert c.wait_for(
                lambda c: any(m.get("code") == "IDLE_TIMEOUT" for _, m in c.messages), 10
            )
            assert c.closed.wait(10)


def test_disconnect_with_buffered_audio_is_transcribed() -> None:
    engine = Recording(create_engine(whisper_settings()))
    with live_server(create_app(whisper_settings(), engine=engine)) as srv:  # type: ignore[arg-type]
        audio = load("sentence_04.wav")
        with open_ws(srv.url, use_server_vad="false") as ws:
            stream(ws, audio, speed=8.0)
            time.sleep(0.3)
        # gone before any flush: the buffered utterance is still transcribed (and logged)
        duration = len(audio) / 16000
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(d >= duration - 0.1 for d in engine.calls):
            time.sleep(0.05)
        assert any(d >= duration - 0.1 for d in engine.calls), engine.calls
        while time.monotonic() < deadline and len(srv.ctx.sessions):
            time.sleep(0.05)  # counted until its final is delivered or dropped
        assert len(srv.ctx.sessions) == 0


def test_sessions_share_no_state(server: LiveServer) -> None:
    audio = np.concatenate([load("three_sentences.wav"), np.zeros(16000, np.float32)])
    with open_ws(server.url) as vad_on, open_ws(server.url, use_server_vad="false") as vad_off:
        on, off = Collector(vad_on), Collector(vad_off)
        threads = [
            threading.Thread(target=stream, args=(vad_on, audio), kwargs={"speed": 3.0}),
            threading.Thread(target=stream, args=(vad_off, audio), kwargs={"speed": 3.0}),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert on.wait_for(lambda c: len(c.finals()) >= 3, timeout=20)
        assert off.finals() == []  # the other session's VAD setting did not leak in


def test_finals_keep_coming_during_a_long_upload(server: LiveServer) -> None:
    """Real-time jobs run between the segments of a long HTTP upload."""
    done = threading.Event()
    done_at: list[float] = []

    def upload() -> None:
        for _ in range(2):
            httpx.post(
                server.url + "/v1/audio/transcriptions",
                files={"file": ("a.wav", speech.path("long_2min.wav").read_bytes())},
                timeout=300,
            )
        done_at.append(time.perf_counter())
        done.set()

    uploader = threading.Thread(target=upload)
    uploader.start()
    deadline = time.monotonic() + 60  # the upload is at the engine
    while not server.ctx.scheduler.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.ctx.scheduler.busy, "the upload never reached the engine"
    audio = np.concatenate([load("three_sentences.wav"), np.zeros(16000, np.float32)])
    with open_ws(server.url) as ws:
        c = Collector(ws)
        started, _ = stream(ws, audio, speed=1.0)
        assert c.wait_for(lambda c: len(c.finals()) >= 3, timeout=20)
    first_final = next(t for t, m in c.messages if m.get("is_final"))
    assert len(c.finals()) == 3
    uploader.join(300)
    # The first sentence ends ~3.2 s into the stream: its final came while the uploads
    # (several segments each) were still being transcribed, not after them. (How soon is a
    # latency figure, bench/streaming.py: an absolute bound here failed on a busy machine.)
    assert started < first_final < done_at[0]


def test_server_shutdown_sends_the_open_utterances_final() -> None:
    with live_server(create_app(whisper_settings())) as srv:
        ws = open_ws(srv.url, use_server_vad="false")
        c = Collector(ws)
        stream(ws, load("sentence_07.wav"), speed=8.0)
        time.sleep(0.3)
        srv.server.should_exit = True  # shut down with the utterance still open
        assert c.closed.wait(30)
    assert [normalize(t)[:10] for t in c.finals()] == ["he forgot "]


def test_every_flush_gets_one_final() -> None:
    """A final answers its own flush and every flush sent while it was pending (the first
    carries the text, the others are empty); a failed one is followed by an empty final for
    each flush it answered, so a client waiting for its flush's final never hangs."""
    from qwen3_asr_server.api.seed.wire import answer_messages, answered
    from qwen3_asr_server.streaming.events import Final

    def final(text: str, reason: str, answers: list[str]) -> Final:
        return Final(1, text, reason, tuple(answers), 1.0)

    def texts(event: Final) -> list[str | None]:
        return [m.get("text") if "text" in m else m["status"] for m in answer_messages(event)]

    assert texts(final("hi", "silence", [])) == ["hi"]
    assert texts(final("", "silence", [])) == []  # a VAD false alarm
    assert texts(final("", "silence", ["flush"])) == [""]
    assert texts(final("hi", "flush", ["flush"])) == ["hi", ""]
    assert texts(final("", "flush", [])) == [""]
    # a reset's final is followed by its acknowledgement, in the order the actions came
    assert texts(final("hi", "reset", ["flush"])) == ["hi", "buffer_reset", ""]
    assert texts(final("", "reset", [])) == ["", "buffer_reset"]  # its own audio's final
    # a reset that only answers a pending final gets no empty final of its own (issue 49)
    assert texts(final("", "silence", ["flush", "reset"])) == ["", "buffer_reset"]
    assert texts(final("hi", "flush", ["reset"])) == ["hi", "buffer_reset"]
    assert texts(final("hi", "silence", ["reset", "reset"])) == [
        "hi",
        "buffer_reset",
        "buffer_reset",
    ]
    assert texts(final("", "silence", ["reset", "flush"])) == ["buffer_reset", ""]
    assert answered(final("", "silence", ["flush", "flush"])) == ["flush", "flush"]


def test_a_refused_config_changes_nothing(server: LiveServer) -> None:
    """Issue 58 §2.6: a config refused for its speaker fields still stored its prompt and
    keywords, and the next config applied them."""
    with open_ws(server.url) as ws:
        c = Collector(ws)
        refused = {"prompt": "Zebra", "keywords": ["Quokka"], "known_speaker_names": ["Ann"]}
        ws.send(json.dumps({"action": "config", **refused}))  # known speakers need diarize
        assert c.wait_for(lambda c: any(m.get("code") == "INVALID_VALUE" for _, m in c.messages))
        ws.send(json.dumps({"action": "config", "use_server_vad": True}))
        reply = configured(c, 1)
        assert reply["prompt"] is None and reply["keywords"] == [], reply
