"""WebSocket auth, and the Qwen engine (tiny checkpoint) behind the streaming core."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from websockets.sync.client import connect

from helpers import whisper_settings
from qwen3_asr_server.app import create_app
from qwen3_asr_server.config import Settings
from server import live_server
from streaming_client import Collector, load, open_ws, stream

pytestmark = pytest.mark.slow


def test_websocket_auth() -> None:
    with live_server(create_app(whisper_settings(api_key="s3cret"))) as srv:
        with open_ws(srv.url) as ws:
            assert json.loads(ws.recv(timeout=10))["code"] == "UNAUTHORIZED"
        with open_ws(srv.url, api_key="wrong") as ws:
            assert json.loads(ws.recv(timeout=10))["statusCode"] == 401
        with open_ws(srv.url, api_key="s3cret") as ws:  # browsers: query parameter
            assert json.loads(ws.recv(timeout=10))["status"] == "connected"
        url = srv.url.replace("http://", "ws://") + "/ws/transcribe"
        with connect(url, additional_headers={"Authorization": "Bearer s3cret"}) as ws:
            assert json.loads(ws.recv(timeout=10))["status"] == "connected"
        realtime = srv.url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
        with connect(realtime) as ws:
            event = json.loads(ws.recv(timeout=10))
            assert event["type"] == "error" and event["error"]["code"] == "invalid_api_key"


def test_realtime_refuses_other_intents() -> None:
    with live_server(create_app(whisper_settings())) as srv:
        url = srv.url.replace("http://", "ws://") + "/v1/realtime?intent=conversation"
        with connect(url) as ws:
            assert json.loads(ws.recv(timeout=10))["error"]["code"] == "unsupported_intent"


def test_qwen_engine_behind_the_streaming_core(tiny_qwen_dir: Path) -> None:
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None, model_id=str(tiny_qwen_dir), max_new_tokens=6, idle_timeout=0
    )
    with live_server(create_app(settings)) as srv:
        with open_ws(srv.url, language="zh") as ws:
            c = Collector(ws)
            audio = np.concatenate([load("three_sentences.wav"), np.zeros(16000, np.float32)])
            stream(ws, audio, speed=4.0)
            assert c.wait_for(lambda c: len(c.finals()) >= 1, timeout=30)
            assert srv.get("/health").json()["streaming_sessions"] == 1
        # random weights: the words are noise, the protocol is not
        assert all(isinstance(t, str) for t in c.finals())
        assert srv.ctx.manager.loaded
        for _ in range(100):  # the closed session leaves the registry
            if srv.get("/health").json()["streaming_sessions"] == 0:
                break
            __import__("time").sleep(0.05)
        assert srv.get("/health").json()["streaming_sessions"] == 0
