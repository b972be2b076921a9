"""Live speakers and stream times (issue 51): `/ws/transcribe?diarize=true` labels each final
with `speaker` (A, B, ... in order of first appearance, or a known speaker's name), splits a
final at a change of speaker, and every final carries `start`/`end` (seconds since the
stream began). Whisper, real speech (meeting.wav's three voices), a real server, real
sockets, and the real fingerprint child. Streams go at twice real-time pace: labels do not
depend on pace (bench/live_speakers.py measures latency at real-time pace).

The server waits up to 5 s for a speaker (WS_SPEAKER_WAIT_S), so a busy machine delays a
label but never drops it; the kill test runs a server of its own with the default wait."""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile as sf
from prometheus_client.parser import text_string_to_metric_families

from calls import clip
from diar_metrics import scores
from helpers import whisper_settings
from qwen3_asr_server.app import create_app
from realtime_client import client_for, collect, completed, encode, send
from server import LiveServer, live_server
from streaming_client import Collector, load, open_ws, pcm16, stream

pytestmark = pytest.mark.slow
RATE = 16000
GAP = np.zeros(RATE, np.float32)  # a second of silence: the turn ends


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(create_app(whisper_settings(ws_speaker_wait_s=5.0))) as srv:
        yield srv


def tight(samples: np.ndarray) -> np.ndarray:
    """The clip without its leading and trailing silence."""
    loud = np.flatnonzero(np.abs(samples) > 0.01)
    return samples[loud[0] : loud[-1] + 1]


def truth() -> list[dict[str, Any]]:
    return json.loads(open(os.path.join("tests", "data", "speech", "meeting.json")).read())


def run(
    srv: LiveServer,
    audio: np.ndarray,
    speed: float = 2.0,
    configs: tuple[dict[str, Any], ...] = (),
    **query: str,
) -> list[dict[str, Any]]:
    """Stream `audio` (16 kHz mono) after the `configs`, then reset; every message up to the
    reset's answer (it comes after every final before it)."""
    with open_ws(srv.url, language="en", **query) as ws:
        json.loads(ws.recv(timeout=30))
        collector = Collector(ws)
        for config in configs:
            ws.send(json.dumps({"action": "config", **config}))
        assert collector.wait_for(
            lambda c: sum(m.get("status") == "configured" for _, m in c.messages) == len(configs)
        )
        stream(ws, audio, speed=speed)
        ws.send(json.dumps({"action": "reset"}))
        done = lambda c: any(m.get("status") == "buffer_reset" for _, m in c.messages)  # noqa: E731
        assert collector.wait_for(done, timeout=120)
    return [m for _, m in collector.messages]


def spoken(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in messages if m.get("is_final") and m["text"].strip()]


def check_times(finals: list[dict[str, Any]], seconds: float) -> None:
    """Every final's times lie inside the audio sent, and they only move forward."""
    end = 0.0
    for final in finals:
        assert 0 <= final["start"] <= final["end"] <= seconds + 0.01, final
        assert final["start"] >= end - 0.001, (final, end)
        end = final["end"]


def test_a_meeting_streamed_live_gets_its_three_speakers_and_times(server: LiveServer) -> None:
    """meeting.wav (three voices, 0.7 s between turns, one overlap): every
    final has a speaker, three are found, at most 5% of speech time goes to the wrong one
    (best mapping), and the finals' times match the voices' turns."""
    audio = load("meeting.wav")
    finals = spoken(run(server, audio, diarize="true"))
    check_times(finals, len(audio) / RATE)
    assert all(f["speaker"] is not None for f in finals), finals
    turns = [(t["speaker"], t["start"], t["end"]) for t in truth()]
    said = [(f["speaker"], f["start"], f["end"]) for f in finals]
    result = scores(turns, said)
    assert result["speakers"] == 3, finals
    assert result["confusion"] <= 0.05, (result, finals)
    assert [f["speaker"] for f in finals][:3] == ["A", "B", "C"]  # in order of appearance


def test_a_change_of_speaker_inside_one_utterance_splits_its_final(server: LiveServer) -> None:
    """Two voices heard alone, then the first followed by the second with no pause between
    them (one utterance for voice detection): two finals, each with its own speaker, its own
    words and times that meet where the voices change."""
    m3, f4, before = clip("meeting:0"), clip("meeting:1"), tight(clip("meeting:6"))
    joined = np.concatenate([before, tight(clip("meeting:7"))])
    audio = np.concatenate([m3, GAP, f4, GAP, joined, GAP])
    finals = spoken(run(server, audio, diarize="true"))
    check_times(finals, len(audio) / RATE)
    assert [f["speaker"] for f in finals] == ["A", "B", "A", "B"], finals
    first, second = finals[2], finals[3]
    change = (len(m3) + len(GAP) + len(f4) + len(GAP) + len(before)) / RATE
    assert abs(first["end"] - change) < 0.75 and second["start"] == first["end"]
    assert "let us" in first["text"].lower() and "release" in second["text"].lower(), finals


def data_url(samples: np.ndarray) -> str:
    out = io.BytesIO()
    sf.write(out, samples, RATE, format="WAV", subtype="PCM_16")
    return "data:audio/wav;base64," + base64.b64encode(out.getvalue()).decode()


def voice(name: str) -> np.ndarray:
    return load(f"voice_{name}.wav")


def test_known_speakers_are_named_and_other_voices_lettered(server: LiveServer) -> None:
    config = {
        "diarize": True,
        "known_speaker_names": ["Maria", "Omar"],
        "known_speaker_references": [data_url(voice("f4")), data_url(voice("m3"))],
    }
    audio = np.concatenate([clip("meeting:2"), GAP, clip("meeting:0"), GAP, clip("meeting:1")])
    finals = spoken(run(server, audio, configs=(config,)))
    assert [f["speaker"] for f in finals] == ["A", "Omar", "Maria"], finals


def test_stereo_speakers_are_labelled_within_each_channel(server: LiveServer) -> None:
    """A conference line on channel 0 (two voices in turn) and a caller on channel 1: each
    channel has its own speakers and its own forward-moving times."""
    left = np.concatenate([clip("meeting:0"), GAP, clip("meeting:1"), GAP, clip("meeting:6")])
    right = np.zeros_like(left)
    caller = clip("meeting:2")
    right[len(clip("meeting:0")) + RATE // 2 :][: len(caller)] = caller * 0.9
    frames = np.stack([left, right], axis=1).reshape(-1)
    with open_ws(server.url, language="en", channels="2", diarize="true") as ws:
        json.loads(ws.recv(timeout=30))
        collector = Collector(ws)
        step = RATE // 10 * 2
        started = time.perf_counter()
        for n, i in enumerate(range(0, len(frames), step)):
            time.sleep(max(0.0, started + n * 0.05 - time.perf_counter()))  # twice real time
            ws.send(pcm16(frames[i : i + step]))
        ws.send(json.dumps({"action": "reset"}))
        resets = lambda c: sum(m.get("status") == "buffer_reset" for _, m in c.messages) == 2  # noqa: E731
        assert collector.wait_for(resets, timeout=120)
    finals = spoken([m for _, m in collector.messages])
    by_channel = {c: [f for f in finals if f["channel"] == c] for c in (0, 1)}
    for channel in by_channel.values():
        check_times(channel, len(left) / RATE)
    assert [f["speaker"] for f in by_channel[0]] == ["A", "B", "A"], by_channel
    assert [f["speaker"] for f in by_channel[1]] == ["A"], by_channel


def config_reply(ws: Any, collector: Collector, message: dict[str, Any]) -> dict[str, Any]:
    before = len(collector.messages)
    ws.send(json.dumps({"action": "config", **message}))
    got = lambda c: len(c.messages) > before  # noqa: E731
    assert collector.wait_for(got)
    return collector.messages[before][1]


def test_bad_speaker_configs_are_answered_and_the_stream_goes_on(server: LiveServer) -> None:
    long_clip = np.tile(voice("m1"), 3)[: 12 * RATE]
    url = data_url(voice("m1"))
    with open_ws(server.url, language="en") as ws:
        json.loads(ws.recv(timeout=30))
        collector = Collector(ws)
        bad = [
            {"diarize": "maybe"},
            {"diarize": True, "known_speaker_names": "Ann"},
            {"diarize": True, "known_speaker_references": [5]},
            {"known_speaker_names": ["Ann"], "known_speaker_references": [url]},
            {
                "diarize": True,
                "known_speaker_names": ["Ann", "Bo"],
                "known_speaker_references": [url],
            },
            {"diarize": True, **known(["P", "Q", "R", "S", "T"], [url] * 5)},
            {"diarize": True, **known(["Ann"], [data_url(long_clip)])},
            {"diarize": True, **known(["Ann"], ["https://example.com/a.wav"])},
        ]
        for message in bad:
            reply = config_reply(ws, collector, message)
            assert reply.get("code") == "INVALID_VALUE" and reply["statusCode"] == 400, reply
        assert "At most 4" in config_reply(ws, collector, bad[5])["message"]
        assert "10 s" in config_reply(ws, collector, bad[6])["message"]
        ok = config_reply(ws, collector, {"diarize": True, "unknown_field": 1})
        assert ok["status"] == "configured" and ok["diarize"] is True
        ws.send(pcm16(clip("meeting:2")))
        ws.send(json.dumps({"action": "flush"}))
        assert collector.wait_for(lambda c: any(m.get("is_final") for _, m in c.messages), 60)
    final = next(m for _, m in collector.messages if m.get("is_final"))
    assert final["speaker"] == "A" and "budget" in final["text"].lower()


def known(names: list[str], urls: list[str]) -> dict[str, Any]:
    return {"known_speaker_names": names, "known_speaker_references": urls}


def test_finals_of_a_stream_without_diarize_carry_times_and_no_speaker(server: LiveServer) -> None:
    """The old server's clients see the fields they know; finals add `start`/`end` only."""
    audio = np.concatenate([clip("meeting:2"), GAP])
    messages = run(server, audio, speed=2.0)
    finals = spoken(messages)
    assert len(finals) == 1 and "speaker" not in finals[0]
    check_times(finals, len(audio) / RATE)
    assert "diarize" not in messages[0]


def test_realtime_items_carry_their_speaker_when_the_session_diarizes(server: LiveServer) -> None:
    audio = np.concatenate([clip("meeting:0"), GAP, clip("meeting:1"), GAP, clip("meeting:6"), GAP])
    with client_for(server).realtime.connect(extra_query={"intent": "transcription"}) as conn:
        conn.recv()
        conn.session.update(
            session={
                "type": "transcription",
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcm", "rate": 24000},
                        "transcription": {"language": "en", "diarize": True},  # type: ignore[typeddict-unknown-key]
                    }
                },
            }
        )
        data, chunk = encode(audio, "pcm24")
        sender = threading.Thread(target=send, args=(conn, data, chunk, 2.0))
        sender.start()
        events = collect(conn, lambda ev: len(completed(ev)) >= 3)
        sender.join()
    updated = next(e for e in events if e.type == "session.updated")
    assert updated.session.audio.input.transcription.diarize is True  # type: ignore[union-attr]
    assert [e.speaker for e in completed(events)] == ["A", "B", "A"]  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def quick_server() -> Iterator[LiveServer]:
    with live_server(create_app(whisper_settings(ws_speaker_wait_s=0.3))) as srv:
        yield srv


def live_speakers(srv: LiveServer) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(srv.url + "/health", timeout=10).json()["live_speakers"]
    return body


def wait_health(srv: LiveServer, predicate: Any, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = live_speakers(srv)
        if predicate(state):
            return state
        time.sleep(0.05)
    raise AssertionError(f"live_speakers never got there: {live_speakers(srv)}")


def test_a_killed_fingerprint_child_costs_speakers_not_the_stream(
    quick_server: LiveServer,
) -> None:
    """The child killed mid-stream: the next final goes out on time with `speaker: null`,
    /health says why, the child comes back by itself, and the stream is served throughout."""
    with open_ws(quick_server.url, language="en", diarize="true") as ws:
        json.loads(ws.recv(timeout=30))
        collector = Collector(ws)
        ready = wait_health(quick_server, lambda s: s["state"] == "ready")
        count = lambda n: lambda c: len(spoken([m for _, m in c.messages])) >= n  # noqa: E731
        stream(ws, np.concatenate([clip("meeting:0"), GAP]), speed=2.0)
        assert collector.wait_for(count(1), timeout=60)
        os.kill(ready["pid"], signal.SIGKILL)
        wait_health(quick_server, lambda s: s["restarts"] >= 1)
        # fast, so the utterance ends while the child is still coming back (a start takes
        # seconds: a fresh process imports torch and loads the model)
        stream(ws, np.concatenate([clip("meeting:1"), GAP]), speed=20.0)
        assert collector.wait_for(count(2), timeout=60)
        back = wait_health(quick_server, lambda s: s["state"] == "ready")
        assert back["pid"] not in (None, ready["pid"])
    finals = spoken([m for _, m in collector.messages])
    assert finals[0]["speaker"] == "A" and finals[1]["speaker"] is None, finals
    assert "release" in finals[1]["text"].lower()
    health = live_speakers(quick_server)
    assert health["missing"] >= 1 and health["last_missing_reason"], health


def test_a_hung_fingerprint_child_shows_in_health_and_does_not_hold_shutdown() -> None:
    """Issue 58 §2.7: a stopped (SIGSTOP) child went unnoticed for 60 s: /health said ready
    while every final went out with `speaker: null`, and shutting down waited 50 s for it.
    Now /health says it is not answering, the call's deadline is sized to its work, and
    shutdown kills it."""
    app = create_app(whisper_settings(ws_speaker_wait_s=0.3))
    with live_server(app) as srv, open_ws(srv.url, language="en", diarize="true") as ws:
        json.loads(ws.recv(timeout=30))
        collector = Collector(ws)
        ready = wait_health(srv, lambda s: s["state"] == "ready")
        os.kill(ready["pid"], signal.SIGSTOP)
        try:
            stream(ws, np.concatenate([clip("meeting:0"), GAP]), speed=4.0)
            got = lambda c: spoken([m for _, m in c.messages])  # noqa: E731
            assert collector.wait_for(got, timeout=60)
            assert got(collector)[0]["speaker"] is None  # on time, without its speaker
            hung = wait_health(srv, lambda s: s["state"] == "not_answering", timeout=30)
            assert "not answered" in hung["reason"], hung
            stopping = time.monotonic()
        except BaseException:
            os.kill(ready["pid"], signal.SIGCONT)
            raise
    assert time.monotonic() - stopping < 20  # shutdown killed it (it waited 50 s)


def test_the_first_final_waits_for_the_child_its_stream_started() -> None:
    """Issue 58 §1/§3: the first final of a stream lost its speaker while the fingerprint
    child was cold (started when the stream connected; seconds to import torch and load
    the model), even on a server that then labelled every final. It now waits for that
    start, within a bound; a restart after a death still holds no final (the kill test).
    The wait for the fingerprint itself (1.5 s) is far less than a cold start (2-7 s, more on
    a busy machine) and enough for one fingerprint on a busy machine."""
    app = create_app(whisper_settings(ws_speaker_wait_s=1.5))
    with live_server(app) as srv, open_ws(srv.url, language="en", diarize="true") as ws:
        json.loads(ws.recv(timeout=30))
        collector = Collector(ws)
        assert live_speakers(srv)["state"] in ("starting", "ready")
        stream(ws, np.concatenate([clip("meeting:0"), GAP]), speed=20.0)  # before it is up
        got = lambda c: spoken([m for _, m in c.messages])  # noqa: E731
        assert collector.wait_for(got, timeout=90)
        assert got(collector)[0]["speaker"] == "A", got(collector)


def engine_calls(srv: LiveServer) -> float:
    """Seconds of audio the engine has transcribed (counted once a call has returned)."""
    text = httpx.get(srv.url + "/metrics", timeout=10).text
    families = text_string_to_metric_families(text)
    audio = (f for f in families if f.name == "asr_audio_seconds")
    return sum(s.value for f in audio for s in f.samples if s.name == "asr_audio_seconds_total")


def test_a_config_sent_while_a_final_waits_for_known_speakers_keeps_the_stream_going() -> None:
    """Issue 58 §2.1, on a fresh server (the child's cold start is the window): known
    speakers set, an utterance flushed, then `diarize: false` while the final waits for
    their fingerprints. That config ended the stream's finals for good (no final, no flush
    answer, nothing logged); the finals and flush answers go on."""
    with (
        live_server(create_app(whisper_settings(ws_speaker_wait_s=5.0))) as srv,
        open_ws(srv.url, language="en", diarize="true") as ws,
    ):
        json.loads(ws.recv(timeout=30))
        collector = Collector(ws)
        reply = config_reply(ws, collector, known(["Omar"], [data_url(voice("m3"))]))
        assert reply["status"] == "configured", reply
        calls = engine_calls(srv)
        ws.send(pcm16(clip("meeting:0")))
        ws.send(json.dumps({"action": "flush"}))
        # its text is ready (the engine answered): the final now waits for its speaker
        deadline = time.monotonic() + 120
        while engine_calls(srv) == calls and time.monotonic() < deadline:
            time.sleep(0.02)
        cold = live_speakers(srv)["state"] == "starting"
        off = config_reply(ws, collector, {"diarize": False})
        assert off["status"] == "configured" and off["diarize"] is False, off
        ws.send(pcm16(clip("meeting:1")))
        ws.send(json.dumps({"action": "flush"}))
        two = lambda c: len(spoken([m for _, m in c.messages])) >= 2  # noqa: E731
        assert collector.wait_for(two, timeout=120), collector.messages
    first, second = spoken([m for _, m in collector.messages])
    assert "release" in second["text"].lower() and "speaker" not in second, (first, second)
    assert cold, "the child was already warm: the window was not tested"


@pytest.mark.parametrize("kind", ["silence", "noise"])
def test_a_known_speaker_clip_without_speech_is_refused(server: LiveServer, kind: str) -> None:
    """Issue 58 §2.5: the live route accepted silent or noise reference clips, which uploads
    refuse ("holds no speech"); the stream goes on."""
    rng = np.random.default_rng(7)
    audio = np.zeros(4 * RATE, np.float32)
    if kind == "noise":
        audio = (rng.standard_normal(4 * RATE) * 0.05).astype(np.float32)
    with open_ws(server.url, language="en") as ws:
        json.loads(ws.recv(timeout=30))
        collector = Collector(ws)
        reply = config_reply(ws, collector, {"diarize": True, **known(["Ann"], [data_url(audio)])})
        assert reply.get("code") == "INVALID_VALUE", reply
        assert "known_speaker_references[0] holds no speech" in reply["message"], reply
        ok = config_reply(
            ws, collector, {"diarize": True, **known(["Ann"], [data_url(voice("f4"))])}
        )
        assert ok["status"] == "configured", ok
