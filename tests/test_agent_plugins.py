"""The voice-agent frameworks' Deepgram plugins against our /v1/listen, unchanged and driven as
each framework drives them (issue 52; docs/notes/issue52-frameworks.md): LiveKit Agents'
`deepgram.STT` (raw aiohttp) and Pipecat's `DeepgramSTTService` (deepgram-sdk) in a real
Pipecat pipeline. `make clients` installs each in a venv of its own (tests/clients/); each
runs as its own process, in real time, and prints what it got as JSON."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from loguru import logger

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
    """One whisper server for both plugins; its Deepgram idle close (10 s, the default) comes
    after their KeepAlive, or it would close them between two."""
    settings = whisper_settings(api_key=KEY)
    assert settings.deepgram_idle_timeout_s > KEEPALIVE_S
    with live_server(create_app(settings)) as srv:
        yield srv


def seats_given_back(srv: LiveServer, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if srv.get("/health").json()["streaming_sessions"] == 0:
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
    assert seats_given_back(server)
    return out


def test_livekit_stream_gives_speech_events_interims_and_a_final(
    livekit: dict[str, Any],
) -> None:
    """What an AgentSession's stt_node gets: START_OF_SPEECH (our SpeechStarted), interims,
    the final, then END_OF_SPEECH from the final's `speech_final` (our endpointing on the
    second of silence after the speech: before the input ended, so not the Finalize that
    `end_input()` sends). No error, no retry, and the stream ends once we close."""
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
def test_pipecat_pipeline_gets_a_finalized_transcript_and_its_seat_is_given_back(
    installed: None, server: LiveServer
) -> None:
    """Pipecat's Silero hears the end of speech first and the service sends Finalize: the
    final comes back `from_finalize`, which Pipecat marks `finalized` (its turn ends without
    waiting). Its EndFrame sends CloseStream and drops the socket at once: the stream's seat
    is still given back, and the server logs no error for that close."""
    name, reference = sentence()
    records: list[str] = []
    sink = logger.add(
        lambda m: records.append(str(m)), level="WARNING", format="{level} {name} {message}"
    )
    try:
        args = [str(PIPECAT_PYTHON), "pipecat_client.py", server.url, KEY, str(speech.path(name))]
        out = run(args, {})
        assert seats_given_back(server)
    finally:
        logger.remove(sink)
    assert out["errors"] == [], out
    assert out["vad_stops"] >= 1, out
    assert out["interims"] >= 1, out
    text = " ".join(f["text"] for f in out["finals"])
    assert close(text, reference), out
    assert any(f["finalized"] for f in out["finals"]), out
    assert records == [], records
