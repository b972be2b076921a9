"""WebSocket auth (header, query, browser subprotocol), and the Qwen engine (tiny
checkpoint) behind the streaming core."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect
from websockets.typing import Subprotocol

from helpers import whisper_settings
from qwen3_asr_server.app import create_app
from qwen3_asr_server.config import Settings
from server import LiveServer, live_server
from streaming_client import Collector, load, open_ws, stream

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def keyed() -> Iterator[LiveServer]:
    """API_KEY=s3cret; these tests open and close sockets, nothing stays behind."""
    with live_server(create_app(whisper_settings(api_key="s3cret"))) as srv:
        yield srv


@pytest.fixture(scope="module")
def open_server() -> Iterator[LiveServer]:
    """No API key."""
    with live_server(create_app(whisper_settings())) as srv:
        yield srv


def test_websocket_auth(keyed: LiveServer) -> None:
    srv = keyed
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


def offer(*names: str) -> list[Subprotocol]:
    return [Subprotocol(name) for name in names]


def test_browser_key_subprotocol(keyed: LiveServer) -> None:
    """The OpenAI JS SDK in a browser sends the key as a subprotocol. It is accepted as the API
    key on both endpoints; the echoed subprotocol is `realtime` if offered, else the first
    offered one, and never the one that carries the key."""
    srv = keyed
    base = srv.url.replace("http://", "ws://")
    realtime = base + "/v1/realtime?intent=transcription"
    browser = ["realtime", "openai-insecure-api-key.s3cret", "openai-beta.realtime-v1"]
    with connect(realtime, subprotocols=offer(*browser)) as ws:
        assert ws.subprotocol == "realtime"
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
    wrong = ["realtime", "openai-insecure-api-key.guess"]
    with connect(realtime, subprotocols=offer(*wrong)) as ws:
        assert ws.subprotocol == "realtime"
        event = json.loads(ws.recv(timeout=10))
        assert event["type"] == "error" and event["error"]["code"] == "invalid_api_key"
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
    transcribe = base + "/ws/transcribe"
    offered = ["openai-insecure-api-key.s3cret", "openai-beta.realtime-v1"]
    with connect(transcribe, subprotocols=offer(*offered)) as ws:
        assert ws.subprotocol == "openai-beta.realtime-v1"
        assert json.loads(ws.recv(timeout=10))["status"] == "connected"
    only_key = ["openai-insecure-api-key.s3cret"]
    with connect(transcribe, subprotocols=offer(*only_key)) as ws:
        assert ws.subprotocol is None  # the key is never echoed
        assert json.loads(ws.recv(timeout=10))["status"] == "connected"
    with connect(transcribe, subprotocols=offer("openai-insecure-api-key.nope")) as ws:
        assert json.loads(ws.recv(timeout=10))["code"] == "UNAUTHORIZED"


def test_subprotocol_is_echoed_without_an_api_key(open_server: LiveServer) -> None:
    srv = open_server
    base = srv.url.replace("http://", "ws://")
    url = base + "/v1/realtime?intent=transcription"
    with connect(url, subprotocols=offer("openai-beta.realtime-v1", "realtime")) as ws:
        assert ws.subprotocol == "realtime"
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
    with connect(base + "/ws/transcribe", subprotocols=offer("pcm16")) as ws:
        assert ws.subprotocol == "pcm16"
        assert json.loads(ws.recv(timeout=10))["status"] == "connected"


def test_realtime_refuses_other_intents(open_server: LiveServer) -> None:
    srv = open_server
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
