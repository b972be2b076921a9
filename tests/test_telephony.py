"""Telephony audio (G.711 μ-law / A-law at 8 kHz): through /v1/realtime with the openai
SDK's realtime client at real-time pace, scored against the same speech sent as 24 kHz
PCM; and raw G.711 bytes on /ws/transcribe (`encoding=mulaw|alaw`)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import soxr
from loguru import logger

import speech
from engines import Capturing
from helpers import whisper_settings
from qwen3_asr_server.app import create_app
from qwen3_asr_server.audio import g711
from qwen3_asr_server.engines import create_engine
from realtime_client import client_for, collect, completed, encode, send
from server import LiveServer, live_server
from streaming_client import Collector, load, open_ws, pcm16
from wer import wer

pytestmark = pytest.mark.slow
SETTINGS = whisper_settings()
FORMATS: dict[str, dict[str, Any]] = {
    "pcm24": {"type": "audio/pcm", "rate": 24000},
    "pcm8": {"type": "audio/pcm", "rate": 8000},  # the control: telephone bandwidth, no G.711
    "pcmu": {"type": "audio/pcmu"},
    "pcma": {"type": "audio/pcma"},
}


@pytest.fixture(scope="module")
def engine() -> Capturing:
    return Capturing(create_engine(SETTINGS))


@pytest.fixture(scope="module")
def server(engine: Capturing) -> Iterator[LiveServer]:
    with live_server(create_app(SETTINGS, engine=engine)) as srv:  # type: ignore[arg-type]
        yield srv


def test_g711_tables_invert() -> None:
    """Every code decodes to a value that encodes back to a code of the same value."""
    for law in ("mulaw", "alaw"):
        values = g711.decode(bytes(range(256)), law)  # type: ignore[arg-type]
        again = g711.decode(g711.encode(values, law), law)  # type: ignore[arg-type]
        assert np.array_equal(values, again)
        assert abs(values).max() <= 1.0


def realtime_transcript(server: LiveServer, fmt: str, audio: np.ndarray, turns: int) -> str:
    """Stream `audio` in `fmt` at real-time pace; the finals' text, joined."""
    with client_for(server).realtime.connect(extra_query={"intent": "transcription"}) as conn:
        assert conn.recv().type == "session.created"
        session: Any = {
            "type": "transcription",
            "audio": {
                "input": {
                    "format": FORMATS[fmt],
                    "transcription": {"model": "gpt-4o-transcribe", "language": "en"},
                    "turn_detection": {"type": "server_vad"},
                }
            },
        }
        conn.session.update(session=session)
        updated = conn.recv()
        assert updated.type == "session.updated"
        assert updated.session.audio.input.format.type == FORMATS[fmt]["type"]  # type: ignore[union-attr]
        data, chunk = encode(audio, fmt)
        sender = threading.Thread(target=send, args=(conn, data, chunk, 1.0))
        sender.start()
        events = collect(conn, lambda ev: len(completed(ev)) >= turns, timeout=90)
        sender.join()
    finals = completed(events)
    assert len(finals) == turns, [e.type for e in events]
    return " ".join(e.transcript for e in finals)


def test_telephony_audio_through_realtime_at_real_time_pace(server: LiveServer) -> None:
    name = "three_sentences.wav"
    audio = np.concatenate([load(name), np.zeros(24000, np.float32)])
    ref = speech.transcripts()[name]
    # the four sessions at once, as four callers would: each is paced by its own clock
    with ThreadPoolExecutor(len(FORMATS)) as pool:
        heard = {fmt: pool.submit(realtime_transcript, server, fmt, audio, 3) for fmt in FORMATS}
        scores = {fmt: wer([ref], [future.result()]) for fmt, future in heard.items()}
    logger.info("telephony WER: {}", scores)
    print("telephony WER:", scores)  # the numbers the issue asks for
    assert scores["pcm24"] <= 0.15, scores
    # 8 kHz loses everything above 4 kHz, which costs whisper tiny.en on this synthetic speech
    # (0.04 -> ~0.2-0.35); G.711 itself must cost next to nothing beyond that bandwidth
    for law in ("pcmu", "pcma"):
        assert scores[law] <= 0.45 and scores[law] <= scores["pcm8"] + 0.15, scores


def ws_final(server: LiveServer, data: bytes, step: int, **query: str) -> str:
    """Send 8 kHz audio in messages of `step` bytes, flush, and return the final's text."""
    with open_ws(server.url, sample_rate="8000", language="en", **query) as ws:
        connected = json.loads(ws.recv(timeout=30))
        assert connected["format"] == query.get("encoding", "pcm_s16le")
        assert connected["sample_rate"] == 8000
        collector = Collector(ws)
        for i in range(0, len(data), step):
            ws.send(data[i : i + step])
        ws.send(json.dumps({"action": "flush"}))
        assert collector.wait_for(lambda c: c.finals(), timeout=60)
    return " ".join(collector.finals())


@pytest.mark.parametrize("law", ["mulaw", "alaw"])
def test_ws_transcribe_takes_raw_g711(server: LiveServer, law: str) -> None:
    """Scored against the same speech sent as 8 kHz PCM (the control): tiny.en at telephone
    bandwidth hears "tonight" as "to hide" and "back" as "Mac", and which of them it hears
    depends on the CPU's arithmetic (AVX2: PCM and A-law 0.333, μ-law 0.222; AVX-512: 0.222
    or less), so the bound is relative. A wrong G.711 table would score near 1."""
    audio = soxr.resample(load("sentence_02.wav"), 16000, 8000)
    data = g711.encode(audio, law)  # type: ignore[arg-type]
    ref = speech.transcripts()["sentence_02.wav"]
    control = wer([ref], [ws_final(server, pcm16(audio), 1600)])  # 100 ms of PCM
    heard = ws_final(server, data, 800, encoding=law)  # 100 ms of G.711
    score = wer([ref], [heard])
    # one word of nine is 0.11: G.711 may cost a word beyond the bandwidth, never more
    assert score <= 0.45 and score <= control + 0.15, (score, control, heard)


def test_ws_transcribe_refuses_g711_at_16k(server: LiveServer) -> None:
    with open_ws(server.url, sample_rate="16000", encoding="mulaw") as ws:
        error = json.loads(ws.recv(timeout=30))
    assert error["code"] == "UNSUPPORTED_ENCODING" and error["statusCode"] == 400


def test_ws_transcribe_prompt_and_keywords_reach_the_engine(
    server: LiveServer, engine: Capturing
) -> None:
    query = {"prompt": "A%20fox.", "keywords": "Fox%20Jumps,Lazy%20Dog", "language": "en"}
    with open_ws(server.url, **query) as ws:
        json.loads(ws.recv(timeout=30))  # connected
        ws.send(json.dumps({"action": "config", "keywords": ["Fox Jumps", "Brown"]}))
        configured = json.loads(ws.recv(timeout=10))
        assert configured["status"] == "configured"
        assert configured["prompt"] == "A fox." and configured["keywords"] == ["Fox Jumps", "Brown"]
        ws.send(json.dumps({"action": "config", "keywords": ["x" * 101]}))
        bad = json.loads(ws.recv(timeout=10))
        assert (bad["code"], bad["statusCode"]) == ("INVALID_VALUE", 400)
        engine.requests.clear()
        collector = Collector(ws)
        ws.send((np.clip(load("sentence_01.wav"), -1, 1) * 32767).astype("<i2").tobytes())
        ws.send(json.dumps({"action": "flush"}))
        assert collector.wait_for(lambda c: c.finals(), timeout=60)
    final = engine.requests[-1]
    assert (final.prompt, final.keywords) == ("A fox.", ("Fox Jumps", "Brown"))
    assert "fox jumps" in " ".join(collector.finals()).lower()
