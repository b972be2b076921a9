"""A real server process (`python -m qwen3_asr_server`) shut down by a signal while a live
stream has a backlog of finals (issue 49): the shutdown ends within SHUTDOWN_TIMEOUT, and a
second SIGTERM or SIGINT ends it at once; either way the finals not transcribed are logged.
Before, the shutdown waited for every queued final (minutes), whatever the signals."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import httpx
import pytest

from proc import WHISPER_BACKEND_ENV, ServerProcess
from streaming_client import Collector, load, open_ws, pcm16

pytestmark = pytest.mark.slow

FLUSHES = 800  # 800 finals of 0.7 s (with the flush's padding): minutes of decoding on a CPU


def start(shutdown_timeout: float) -> tuple[ServerProcess, ServerProcess]:
    """The server, twice: the second as its log (`wait_for` a line, `lines`)."""
    srv = ServerProcess(
        {
            **WHISPER_BACKEND_ENV,
            "LOG_LEVEL": "INFO",
            "WS_MAX_PENDING_S": "600",
            "SHUTDOWN_TIMEOUT": str(shutdown_timeout),
        }
    )
    srv.wait_healthy(120)
    return srv, srv


def pending_seconds(url: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("asr_stream_pending_final_seconds "):
            return float(line.split()[1])
    raise AssertionError("no asr_stream_pending_final_seconds")


def backlog(srv: ServerProcess) -> Collector:
    """A client still connected and reading, with FLUSHES finals queued."""
    ws = open_ws(srv.url, use_server_vad="false")
    got = Collector(ws)
    assert got.wait_for(lambda c: c.messages, 30)  # connected
    chunk = pcm16(load("sentence_02.wav")[16000 : 16000 + 1536])  # 96 ms of speech
    for _ in range(FLUSHES):
        ws.send(chunk)
        ws.send(json.dumps({"action": "flush"}))
    deadline = time.monotonic() + 120
    while pending_seconds(srv.url) < 300:  # most of the flushes are in: a long backlog
        assert time.monotonic() < deadline, "the backlog never built up"
        time.sleep(0.05)
    assert got.wait_for(lambda c: c.finals(), 120)  # finals are being transcribed
    return got


def ended(srv: ServerProcess, timeout: float) -> bool:
    try:
        srv.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


def test_a_shutdown_ends_within_shutdown_timeout_and_logs_what_was_not_transcribed() -> None:
    # (time for a few finals during the drain: one took ~3 s on a busy 2-core machine)
    srv, log = start(shutdown_timeout=10)
    try:
        got = backlog(srv)
        srv.proc.send_signal(signal.SIGTERM)
        assert log.wait_for("finalizing 1 streaming sessions", 30)
        before = len(got.finals())  # (the signal came before this)
        # SHUTDOWN_TIMEOUT (10 s), the running model call's end, the sockets' close
        assert ended(srv, 60), "the shutdown waited for the whole backlog"
        line = log.wait_for("not transcribed", 10)
        assert line and "finals" in line, log.lines[-20:]
        assert got.closed.wait(30)
        # the finals transcribed during the drain, before the time was up, were sent
        assert len(got.finals()) > before, (before, len(got.finals()))
    finally:
        srv.stop()


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_second_signal_ends_the_shutdown_at_once(second: signal.Signals) -> None:
    srv, log = start(shutdown_timeout=600)
    try:
        backlog(srv)
        srv.proc.send_signal(signal.SIGTERM)
        assert log.wait_for("finalizing 1 streaming sessions", 30)  # the drain has begun
        srv.proc.send_signal(second)
        assert ended(srv, 30), "a second signal did not end the shutdown"
        line = log.wait_for("not transcribed", 10)
        assert line and "finals" in line, log.lines[-20:]
    finally:
        srv.stop()
