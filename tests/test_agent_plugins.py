"""The voice-agent frameworks' Deepgram plugins against our /v1/listen, unchanged and driven as
each framework drives them (issue 52; docs/notes/issue52-frameworks.md): LiveKit Agents'
`deepgram.STT` (raw aiohttp) and Pipecat's `DeepgramSTTService` (deepgram-sdk) in a real
Pipecat pipeline. `make clients` installs each in a venv of its own (tests/clients/); each
runs as its own process, in real time, and prints what it got as JSON."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from loguru import logger
from prometheus_client.parser import text_string_to_metric_families

import speech
from helpers import whisper_settings
from qwen3_asr_server.app import create_app
from server import LiveServer, live_server
from test_clients import CLIENTS, KEY, close, run, sentence

pytestmark = pytest.mark.slow

LIVEKIT_PYTHON = CLIENTS / ".venv-livekit" / "bin" / "python"
PIPECAT_PYTHON = CLIENTS / ".venv-pipecat" / "bin" / "python"
KEEPALIVE_S = 5.0  # both plugins send a KeepAlive every 5 s (LiveKit also one at once)


@pytest.fixture(scope="module")
def installed() -> None:
    missing = [p for p in (LIVEKIT_PYTHON, PIPECAT_PYTHON) if not p.exists()]
    if missing:
        pytest.fail(f"the agent plugins are not installed ({missing[0]}): run `make clients`")


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    """One whisper server for both plugins, its model loaded before they stream (as a
    server in use is; a load in mid-sentence left no time for an interim on a busy machine).
    Its Deepgram idle close (10 s, the default) comes after their KeepAlive, or it would
    close them between two."""
    settings = whisper_settings(api_key=KEY, preload=True)
    assert settings.deepgram_idle_timeout_s > KEEPALIVE_S
    with live_server(create_app(settings)) as srv:
        deadline = time.monotonic() + 120
        while not srv.get("/health").json()["model_loaded"]:
            assert time.monotonic() < deadline, "the model did not load"
            time.sleep(0.05)
        yield srv


def seats(srv: LiveServer) -> int:
    return int(srv.get("/health").json()["streaming_sessions"])


def metric(srv: LiveServer, name: str, **labels: str) -> float:
    text = httpx.get(srv.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def settled(srv: LiveServer, timeout: float = 60) -> bool:
    """Every seat given back and every committed final done."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if seats(srv) == 0 and metric(srv, "asr_stream_pending_final_seconds") == 0:
            return True
        time.sleep(0.05)
    return False


# -- LiveKit Agents: livekit-plugins-deepgram ---------------------------------------------------
@pytest.fixture(scope="module")
def livekit(installed: None, server: LiveServer) -> dict[str, Any]:
    """One run of tests/clients/livekit_client.py: a stream, a wrong key, a recognize()."""
    name, _ = sentence()
    args = [str(LIVEKIT_PYTHON), "livekit_client.py", server.url, KEY, str(speech.path(name))]
    out = run(args, {})
    assert settled(server)
    return out


def test_livekit_stream_gives_speech_events_interims_and_a_final(
    livekit: dict[str, Any],
) -> None:
    """What an AgentSession's stt_node gets: START_OF_SPEECH (our SpeechStarted), interims,
    the final, then END_OF_SPEECH from the final's `speech_final`: our endpointing, while
    silence still streamed (before `end_input()` and its Finalize). No error, no retry, and
    the stream ends once we close."""
    _, reference = sentence()
    out = livekit["stream"]
    assert out["errors"] == [] and out["raised"] is None, out
    kinds = [e["type"] for e in out["events"]]
    assert kinds[0] == "start_of_speech", kinds
    assert "interim_transcript" in kinds, kinds
    finals = [e for e in out["events"] if e["type"] == "final_transcript"]
    assert len(finals) == 1, kinds
    assert close(finals[0]["text"], reference), finals
    end = kinds.index("end_of_speech")
    assert kinds.index("final_transcript") < end, kinds
    assert out["events"][end]["t"] < out["input_ended"], out
    assert kinds.count("start_of_speech") == kinds.count("end_of_speech") == 1, kinds
    # the plugin puts the request id of our Results on every event made from one (its
    # speech start and end events carry none of their own)
    ids = {
        e["request_id"]
        for e in out["events"]
        if e["type"] not in ("start_of_speech", "end_of_speech")
    }
    assert len(ids) == 1 and "" not in ids, out["events"]


def test_livekit_with_a_wrong_key_gets_a_401_it_does_not_retry(livekit: dict[str, Any]) -> None:
    out = livekit["wrong_key"]
    assert out["events"] == []
    assert len(out["errors"]) == 1, out
    error, recoverable = out["errors"][0]
    assert "APIStatusError" in error and "status_code=401" in error, error
    assert recoverable is False
    assert out["raised"] == error


def test_livekit_recognize_posts_the_file(livekit: dict[str, Any]) -> None:
    _, reference = sentence()
    out = livekit["recognize"]
    assert out["type"] == "final_transcript"
    assert out["request_id"]
    assert close(out["text"], reference), out


# -- Pipecat: pipecat-ai[deepgram] ---------------------------------------------------------------
def pipecat(srv: LiveServer, mode: str) -> tuple[dict[str, Any], float, list[str]]:
    """One run of tests/clients/pipecat_client.py: what it got, the seconds of audio the
    server's finals transcribed meanwhile, and what the server logged at WARNING and above
    (a traceback is logged at ERROR) until every seat was back and every final done."""
    name, _ = sentence()
    records: list[str] = []
    sink = logger.add(
        lambda m: records.append(str(m)), level="WARNING", format="{level} {name} {message}"
    )
    finals = "asr_audio_seconds_total"
    try:
        before = metric(srv, finals, engine="whisper", priority="final")
        path = str(speech.path(name))
        out = run([str(PIPECAT_PYTHON), "pipecat_client.py", srv.url, KEY, path, mode], {})
        assert settled(srv)
        heard = metric(srv, finals, engine="whisper", priority="final") - before
    finally:
        logger.remove(sink)
    return out, heard, records


def test_pipecat_pipeline_gets_a_finalized_transcript(installed: None, server: LiveServer) -> None:
    """Pipecat's Silero hears the end of speech first and the service sends Finalize: the
    final comes back `from_finalize`, which Pipecat marks `finalized` (its turn ends without
    waiting). Its EndFrame then sends CloseStream and drops the socket at once."""
    _, reference = sentence()
    out, _, records = pipecat(server, "wait")
    assert out["errors"] == [], out
    assert out["vad_stops"] >= 1, out
    assert out["interims"] >= 1, out
    text = " ".join(f["text"] for f in out["finals"])
    assert close(text, reference), out
    assert any(f["finalized"] for f in out["finals"]), out
    assert records == [], records


def test_pipecat_dropping_the_socket_mid_sentence_frees_the_seat_quietly(
    installed: None, server: LiveServer
) -> None:
    """Its EndFrame in mid-sentence: CloseStream, and the socket dropped before the final of
    the open utterance is decoded. That final still runs (the audio is heard) and is not
    sent; the seat is given back and the server logs no error for the close."""
    out, heard, records = pipecat(server, "drop")
    assert out["errors"] == [], out
    assert out["finals"] == [], out  # it had left before its final
    assert heard >= 2.0, heard  # the 2 s of the open utterance (and the 0.5 s before)
    assert records == [], records
