"""Issue 58 §7, a security and robustness sweep of every route: each finding reproduced on a
real server (uvicorn on a loopback port), the way a client would hit it."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from helpers import whisper_settings
from proc import ServerProcess
from qwen3_asr_server.app import create_app
from server import LiveServer, live_server

KEY = "sweep-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(create_app(whisper_settings(api_key=KEY))) as srv:
        yield srv


class HealthProbe:
    """Polls /health in a thread while a test runs; the slowest answer it saw."""

    def __init__(self, srv: LiveServer) -> None:
        self.srv = srv
        self.worst = 0.0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=120) as http:
            while not self.done.is_set():
                start = time.monotonic()
                assert http.get(self.srv.url + "/health").status_code == 200
                self.worst = max(self.worst, time.monotonic() - start)
                self.done.wait(0.05)

    def __enter__(self) -> HealthProbe:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(120)


# --- 7.1: many keywords in one message ---------------------------------------------------


@pytest.mark.slow
def test_a_huge_keyword_list_is_refused_quickly_and_health_stays_responsive(
    server: LiveServer,
) -> None:
    """100,000 keywords in one session.update (under the 1 MiB frame limit) once froze every
    route for 85 s: the duplicate check was quadratic and ran before the 100-keyword limit."""
    words = [f"k{i}" for i in range(100_000)]
    update = {
        "type": "session.update",
        "session": {
            "type": "transcription",
            "audio": {"input": {"transcription": {"keywords": words}}},
        },
    }
    url = server.url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
    with HealthProbe(server) as probe:
        with ws_connect(url, additional_headers=AUTH, max_size=None) as ws:
            assert json.loads(ws.recv(timeout=60))["type"] == "session.created"
            start = time.monotonic()
            ws.send(json.dumps(update))
            event = json.loads(ws.recv(timeout=120))
            took = time.monotonic() - start
        # the same list on the REST route that mints browser secrets
        body = {"session": {"audio": {"input": {"transcription": {"keywords": words}}}}}
        minted = httpx.post(
            server.url + "/v1/realtime/client_secrets", json=body, headers=AUTH, timeout=120
        )
    assert event["type"] == "error" and event["error"]["param"].endswith("keywords"), event
    assert minted.status_code == 400 and "keywords" in minted.json()["error"]["param"]
    # quadratic: ~85 s on a fast CPU; linear: well under a second. Generous bounds for a
    # busy machine.
    assert took < 10, took
    assert probe.worst < 10, probe.worst


@pytest.mark.slow
def test_a_client_secrets_body_is_bounded_before_it_is_read(server: LiveServer) -> None:
    """The session config is small; a body of many MB is refused with 413, not parsed."""
    big = {"session": {"audio": {"input": {"transcription": {"prompt": "x" * (3 << 20)}}}}}
    response = httpx.post(
        server.url + "/v1/realtime/client_secrets", json=big, headers=AUTH, timeout=60
    )
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "too_large"
    assert "MAX_UPLOAD_MB" not in response.json()["error"]["message"]


# --- 7.5: WS_MAX_FRAME_BYTES counts bytes ------------------------------------------------

FRAME = 64 * 1024


@pytest.fixture(scope="module")
def small_frames() -> Iterator[LiveServer]:
    with live_server(create_app(whisper_settings(ws_max_frame_bytes=FRAME))) as srv:
        yield srv


@pytest.mark.slow
@pytest.mark.parametrize("route", ["/ws/transcribe", "/v1/realtime", "/v1/listen"])
def test_the_frame_limit_counts_a_text_messages_bytes(small_frames: LiveServer, route: str) -> None:
    """30,000 CJK characters: under the limit in characters, 90,000 bytes of UTF-8."""
    text = json.dumps({"type": "session.update", "note": "中" * 30_000}, ensure_ascii=False)
    assert len(text) < FRAME < len(text.encode())
    url = small_frames.url.replace("http://", "ws://") + route
    query = {"/v1/realtime": "?intent=transcription", "/v1/listen": "?encoding=linear16"}
    with ws_connect(url + query.get(route, ""), max_size=None) as ws:
        if route != "/v1/listen":
            ws.recv(timeout=60)  # connected / session.created
        ws.send(text)
        answer = ws.recv(timeout=60)
    assert "WS_MAX_FRAME_BYTES" in str(answer), answer


# --- 7.4: a full temp disk ---------------------------------------------------------------


def _small_files() -> None:
    """In the server process: files of at most 4 MB (writing past it fails as a full disk
    does; Python ignores SIGXFSZ, so the write raises instead)."""
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 20, 4 << 20))


@pytest.mark.slow
def test_a_full_temp_disk_is_a_507_that_says_so_logged_once() -> None:
    proc = ServerProcess(
        {"MODEL_ID": "whisper-tiny.en", "LOG_LEVEL": "INFO", "LOG_JSON": "false"},
        preexec_fn=_small_files,
    )
    try:
        proc.wait_healthy(120)
        response = httpx.post(
            proc.url + "/v1/audio/transcriptions",
            files={"file": ("a.wav", b"\0" * (8 << 20))},
            data={"model": "whisper-1"},
            timeout=120,
        )
    finally:
        output = proc.output()
    assert response.status_code == 507, response.text  # was 400 "error parsing the body"
    error = response.json()["error"]
    assert error["code"] == "insufficient_storage" and "disk is full" in error["message"]
    assert output.count("could not be spooled to the temp disk") == 1, output


# --- 7.8: slow clients -------------------------------------------------------------------


def _closed_within(sock: socket.socket, seconds: float, trickle: bool) -> bool:
    """Whether the server closes `sock` within `seconds` while the client sends a header
    line now and then (a slowloris) or nothing."""
    deadline = time.monotonic() + seconds
    sock.settimeout(1.0)
    while time.monotonic() < deadline:
        try:
            if trickle:
                sock.sendall(b"X-Slow: 1\r\n")
            if sock.recv(4096) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:  # reset
            return True
    return False


@pytest.mark.slow
def test_a_request_head_that_trickles_in_or_is_huge_is_dropped() -> None:
    """400 slowloris connections were all held for 40 s (uvicorn bounds only the idle time
    between requests, and any byte resets it)."""
    proc = ServerProcess({"MODEL_ID": "whisper-tiny.en", "LOG_LEVEL": "WARNING"})
    try:
        proc.wait_healthy(120)
        slow = [socket.create_connection(("127.0.0.1", proc.port)) for _ in range(20)]
        for sock in slow:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        big = socket.create_connection(("127.0.0.1", proc.port))
        big.sendall(b"GET /health HTTP/1.1\r\n")
        try:
            for _ in range(200):  # 200 KB of head, at once
                big.sendall(b"X-Big: " + b"a" * 1000 + b"\r\n")
        except OSError:  # closed (then reset) past 64 KiB of head
            pass
        assert _closed_within(big, 5, trickle=False)  # well before the head timeout
        assert all(_closed_within(sock, 60, trickle=True) for sock in slow)
        assert httpx.get(proc.url + "/health", timeout=30).status_code == 200
        # a slow request that is being served is not cut: only its head is timed
        with httpx.Client(timeout=60) as http:
            assert http.get(proc.url + "/health").status_code == 200
    finally:
        for sock in [*slow, big]:
            sock.close()
        proc.output()


# --- 7.9: smaller ------------------------------------------------------------------------


@pytest.mark.slow
def test_a_request_id_that_is_not_printable_ascii_is_replaced(server: LiveServer) -> None:
    """A non-ASCII or control-character id came back with other bytes and went into text
    logs as-is (a forged line); such an id is replaced by a fresh one."""
    kept = httpx.get(server.url + "/health", headers={"X-Request-ID": "abc-123"})
    assert kept.headers["x-request-id"] == "abc-123"
    for bad in ["caf\u00e9".encode("latin-1"), b"a\tb", b"x" * 129]:
        response = httpx.get(server.url + "/health", headers={"X-Request-ID": bad})
        fresh = response.headers["x-request-id"]
        assert fresh != bad.decode("latin-1") and len(fresh) == 32 and fresh.isalnum(), fresh


@pytest.mark.slow
def test_invalid_json_on_client_secrets_says_so(server: LiveServer) -> None:
    response = httpx.post(
        server.url + "/v1/realtime/client_secrets",
        content=b'{"session": ',
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert response.status_code == 400
    error = response.json()["error"]  # was "1: JSON decode error", param "1"
    assert error["param"] is None and error["code"] == "invalid_json", error
    assert "not valid JSON" in error["message"], error
