"""/v1/realtime transcription sessions, driven by the openai SDK's realtime client."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import openai
import pytest
import soxr

import speech
from engines import Recording
from qwen3_asr_server.app import create_app
from qwen3_asr_server.config import Settings
from qwen3_asr_server.engines import create_engine
from realtime_client import collect, completed
from server import LiveServer, live_server
from streaming_client import load, pcm16
from wer import normalize, wer

pytestmark = pytest.mark.slow
SETTINGS = Settings(_env_file=None, model_id="whisper-tiny.en", idle_timeout=0)  # type: ignore[call-arg]


@pytest.fixture(scope="module")
def engine() -> Recording:
    return Recording(create_engine(SETTINGS))


@pytest.fixture(scope="module")
def server(engine: Recording) -> Iterator[LiveServer]:
    with live_server(create_app(SETTINGS, engine=engine)) as srv:  # type: ignore[arg-type]
        yield srv


def client_for(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


def send_audio(conn: Any, samples16k: np.ndarray, speed: float = 4.0) -> None:
    audio24k = soxr.resample(samples16k, 16000, 24000).astype(np.float32)
    step = 2400  # 100 ms at 24 kHz
    for i in range(0, len(audio24k), step):
        chunk = base64.b64encode(pcm16(audio24k[i : i + step])).decode()
        conn.input_audio_buffer.append(audio=chunk)
        time.sleep(0.1 / speed)


def test_server_vad_session_with_the_sdk(server: LiveServer, engine: Recording) -> None:
    audio = np.concatenate([load("three_sentences.wav"), np.zeros(16000, np.float32)])
    with client_for(server).realtime.connect(extra_query={"intent": "transcription"}) as conn:
        first = conn.recv()
        assert first.type == "session.created"
        conn.session.update(
            session={
                "type": "transcription",
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcm", "rate": 24000},
                        "transcription": {"model": "whisper-1", "language": "en"},
                        "turn_detection": {
                            "type": "server_vad",
                            "threshold": 0.5,
                            "silence_duration_ms": 500,
                        },
                    }
                },
            }
        )
        sender = threading.Thread(target=send_audio, args=(conn, audio))
        sender.start()
        events = collect(conn, lambda ev: len(completed(ev)) >= 3)
        sender.join()
    types = [e.type for e in events]
    assert types[0] == "session.updated"
    assert types.count("input_audio_buffer.speech_started") >= 3
    assert types.count("input_audio_buffer.speech_stopped") >= 3
    assert types.count("input_audio_buffer.committed") >= 3
    finals = completed(events)
    assert len(finals) == 3
    assert len({e.item_id for e in finals}) == 3
    ref = speech.transcripts()["three_sentences.wav"]
    assert wer([ref], [" ".join(e.transcript for e in finals)]) < 0.3
    for final in finals:  # deltas are only ever stable text: a prefix of the transcript
        sent = "".join(
            e.delta
            for e in events
            if e.type.endswith("transcription.delta") and e.item_id == final.item_id
        )
        assert normalize(final.transcript).startswith(normalize(sent))
    # partials are fast drafts (their confident words become deltas); finals never are
    assert (True, True) in engine.kinds and (True, False) not in engine.kinds
    assert (False, False) in engine.kinds and (False, True) not in engine.kinds


def test_manual_commit_and_clear(server: LiveServer) -> None:
    with client_for(server).realtime.connect(extra_query={"intent": "transcription"}) as conn:
        assert conn.recv().type == "session.created"
        conn.send(
            {
                "type": "transcription_session.update",
                "session": {
                    "turn_detection": None,
                    "input_audio_transcription": {"language": "en"},
                },
            }
        )
        assert conn.recv().type == "transcription_session.updated"
        send_audio(conn, load("sentence_05.wav"), speed=8)
        conn.input_audio_buffer.clear()
        assert collect(conn, lambda ev: ev and ev[-1].type == "input_audio_buffer.cleared", 10)
        send_audio(conn, load("sentence_02.wav"), speed=8)
        conn.input_audio_buffer.commit()
        events = collect(conn, lambda ev: completed(ev))
    finals = completed(events)
    assert len(finals) == 1  # the cleared audio produced nothing
    assert normalize(finals[0].transcript).startswith("please call me back")
    # usage counts the client's audio, not the silence padded on at commit (was +0.6 s)
    sent = len(load("sentence_02.wav")) / 16000
    assert abs(finals[0].usage.seconds - sent) < 0.02, (finals[0].usage.seconds, sent)
    assert any(e.type == "input_audio_buffer.committed" for e in events)


def test_each_commit_counts_exactly_the_audio_appended_before_it(server: LiveServer) -> None:
    """At 8 kHz the resampler holds a few ms between appends: a commit passes them on, so
    each item's usage is its own audio (issue 41: 0.934 / 1.038 / 0.934 s for 1.0 s each)."""
    audio8k = soxr.resample(load("three_sentences.wav"), 16000, 8000).astype(np.float32)
    with client_for(server).realtime.connect(extra_query={"intent": "transcription"}) as conn:
        assert conn.recv().type == "session.created"
        conn.send(
            {
                "type": "session.update",
                "session": {
                    "type": "transcription",
                    "audio": {
                        "input": {
                            "format": {"type": "audio/pcm", "rate": 8000},
                            "turn_detection": None,
                        }
                    },
                },
            }
        )
        assert conn.recv().type == "session.updated"
        for n in range(3):
            piece = audio8k[n * 8000 : (n + 1) * 8000]
            conn.input_audio_buffer.append(audio=base64.b64encode(pcm16(piece)).decode())
            conn.input_audio_buffer.commit()
        events = collect(conn, lambda ev: len(completed(ev)) == 3)
    seconds = [final.usage.seconds for final in completed(events)]
    assert len(seconds) == 3 and all(abs(s - 1.0) < 0.005 for s in seconds), seconds


def test_errors_use_openai_shape(server: LiveServer) -> None:
    with client_for(server).realtime.connect(extra_query={"intent": "transcription"}) as conn:
        assert conn.recv().type == "session.created"
        conn.send({"type": "response.create"})
        error = conn.recv()
        assert error.type == "error"
        assert error.error.code == "unknown_event" and error.error.message
        conn.send({"type": "input_audio_buffer.append", "audio": "%%% not base64"})
        assert conn.recv().error.code == "invalid_audio"
        conn.input_audio_buffer.commit()  # nothing buffered
        assert conn.recv().error.code == "input_audio_buffer_commit_empty"
        conn.send(
            {
                "type": "session.update",
                "event_id": "evt_lang",
                "session": {"audio": {"input": {"transcription": {"language": "klingon"}}}},
            }
        )
        error = conn.recv()
        assert error.type == "error"
        assert error.error.code == "invalid_value"
        assert error.error.param == "session.audio.input.transcription.language"
        assert error.error.event_id == "evt_lang"  # the client event that caused it
        conn.send(  # a bad value of the right type: still an error, the socket stays open
            {
                "type": "session.update",
                "event_id": "evt_turn",
                "session": {
                    "audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 2}}}
                },
            }
        )
        error = conn.recv()
        assert error.type == "error"
        assert (error.error.param, error.error.event_id) == (
            "session.audio.input.turn_detection.threshold",
            "evt_turn",
        )
        conn.input_audio_buffer.clear()
        assert conn.recv().type == "input_audio_buffer.cleared"
