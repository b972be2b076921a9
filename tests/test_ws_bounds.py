"""Streaming sessions are bounded: a session counts toward WS_MAX_SESSIONS until its last
final has been delivered or dropped, audio received before a disconnect is transcribed, and
a client that sends faster than finals are produced is slowed down, not buffered."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from engines import Recording
from helpers import whisper_settings
from qwen3_asr_server.app import create_app
from qwen3_asr_server.engines import create_engine
from server import live_server
from streaming_client import load, open_ws, pcm16

pytestmark = pytest.mark.slow


def slow_app(delay: float, **settings: object):  # type: ignore[no-untyped-def]
    config = whisper_settings(**settings)
    engine = Recording(create_engine(config), delay=delay)
    return create_app(config, engine=engine), engine  # type: ignore[arg-type]


def sessions(srv) -> int:  # type: ignore[no-untyped-def]
    return int(srv.get("/health").json()["streaming_sessions"])


def test_a_session_counts_until_its_final_after_a_disconnect() -> None:
    app, engine = slow_app(1.5, ws_max_sessions=1)
    with live_server(app) as srv:
        with open_ws(srv.url, use_server_vad="false") as ws:
            assert json.loads(ws.recv(timeout=10))["status"] == "connected"
            ws.send(pcm16(load("sentence_02.wav")))
            time.sleep(0.3)
        # The client left; its audio is being transcribed, and the slot is still taken.
        assert sessions(srv) == 1
        with open_ws(srv.url) as ws:
            refused = json.loads(ws.recv(timeout=10))
            assert refused["code"] == "TOO_MANY_SESSIONS"
        deadline = time.monotonic() + 20
        while sessions(srv) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sessions(srv) == 0
        assert any(abs(c - len(load("sentence_02.wav")) / 16000) < 1.0 for c in engine.calls)
        with open_ws(srv.url) as ws:  # the slot is free again
            assert json.loads(ws.recv(timeout=10))["status"] == "connected"


def test_a_fast_sender_is_held_back_to_the_pending_bound() -> None:
    """60 s of audio sent at once with finals that take 1 s each: the server stops reading
    while more than WS_MAX_PENDING_S waits for finals, then takes the rest; nothing lost."""
    app, _ = slow_app(1.0, ws_max_pending_s=10, ws_max_utterance_s=5)
    audio = np.tile(load("long_2min.wav")[: 16000 * 30], 2)
    with live_server(app) as srv:
        with open_ws(srv.url, use_server_vad="false") as ws:
            assert json.loads(ws.recv(timeout=10))["status"] == "connected"
            pending: list[float] = []
            for i in range(0, len(audio), 16000):
                ws.send(pcm16(audio[i : i + 16000]))
                session = next(iter(srv.ctx.sessions._sessions))
                pending.append(session.pending_seconds)
            ws.send(json.dumps({"action": "flush"}))
            finals = 0
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and srv.ctx.sessions._sessions:
                session = next(iter(srv.ctx.sessions._sessions))
                if finals and session.pending_seconds == 0 and session.turns.utterance is None:
                    break
                try:
                    message = json.loads(ws.recv(timeout=5))
                except TimeoutError:
                    continue
                finals += bool(message.get("is_final"))
        assert max(pending) <= 10 + 5 + 1  # the bound, one utterance past it, one message
        assert finals >= 12  # 60 s in utterances of at most 5 s: every one got its final
