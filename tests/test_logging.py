"""No log line carries an API key: not uvicorn's access log (paths with `?api_key=`), not the
handshake headers websockets prints at DEBUG, not the browsers' key subprotocol."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import httpx
import pytest
from loguru import logger
from websockets.sync.client import connect
from websockets.typing import Subprotocol

from proc import ServerProcess
from qwen3_asr_server.logging import redact, setup_logging

KEY = "sk-live-CORRECT-1234"
WRONG = "sk-wrong-GUESS-5678"


@pytest.fixture
def lines() -> Iterator[list[str]]:
    setup_logging("DEBUG")
    captured: list[str] = []
    sink = logger.add(lambda m: captured.append(str(m)), level="DEBUG", format="{message}")
    yield captured
    logger.remove(sink)
    setup_logging("INFO")


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            f'127.0.0.1:5 - "WebSocket /ws/transcribe?api_key={KEY}&sample_rate=8000" [accepted]',
            '127.0.0.1:5 - "WebSocket /ws/transcribe?api_key=***&sample_rate=8000" [accepted]',
        ),
        (
            f"GET /v1/models?x=1&api%5Fkey={KEY} HTTP/1.1",
            "GET /v1/models?x=1&api%5Fkey=*** HTTP/1.1",
        ),
        (f"< Authorization: Bearer {KEY}", "< Authorization: Bearer ***"),
        (
            f"< Sec-WebSocket-Protocol: realtime, openai-insecure-api-key.{KEY}, openai-beta.x",
            "< Sec-WebSocket-Protocol: realtime, openai-insecure-api-key.***, openai-beta.x",
        ),
        ("the bearer of bad news; an api key", "the bearer of bad news; an api key"),
        # issue 58 §7.2: the name percent-encoded (the server decodes it); Deepgram's browser
        # subprotocols
        (f"GET /ws?%61pi_key={KEY}&x=1 HTTP/1.1", "GET /ws?%61pi_key=***&x=1 HTTP/1.1"),
        (f"GET /ws?%61%70%69%5F%6B%65%79={KEY}", "GET /ws?%61%70%69%5F%6B%65%79=***"),
        (f"GET /ws?a=api_key={KEY}", "GET /ws?a=api_key=***"),
        ("GET /ws?language=en&model=nova-3", "GET /ws?language=en&model=nova-3"),
        (f"> Sec-WebSocket-Protocol: token, {KEY}", "> Sec-WebSocket-Protocol: token, ***"),
    ],
)
def test_redact(line: str, expected: str) -> None:
    assert redact(line) == expected


def test_loguru_and_stdlib_records_are_redacted(lines: list[str]) -> None:
    logger.info("our own line with ?api_key={}", KEY)
    logging.getLogger("uvicorn.access").info('%s - "GET %s" 200', "127.0.0.1:1", f"/?api_key={KEY}")
    logging.getLogger("uvicorn.error").debug("< authorization: Bearer %s", KEY)
    assert len(lines) == 3, lines
    assert not any(KEY in line for line in lines), lines


@pytest.mark.slow
def test_no_key_in_any_log_line_of_the_real_server() -> None:
    """`python -m qwen3_asr_server` (uvicorn's access log on, as in production) at DEBUG, so
    the handshake headers are logged too; every way a key can arrive is used."""
    server = ServerProcess(
        {"MODEL_ID": "whisper-tiny.en", "API_KEY": KEY, "LOG_LEVEL": "DEBUG", "LOG_JSON": "false"}
    )
    try:
        server.wait_healthy()
        base = server.url.replace("http://", "ws://")
        models = httpx.get(
            f"{server.url}/v1/models?api_key={KEY}", headers={"Authorization": f"Bearer {KEY}"}
        )
        assert models.status_code == 200
        httpx.get(f"{server.url}/v1/models?api_key={WRONG}")
        with connect(f"{base}/ws/transcribe?api_key={KEY}&request_id=rid-logs") as ws:
            assert json.loads(ws.recv(timeout=10))["status"] == "connected"
        with connect(f"{base}/ws/transcribe?sample_rate=8000&api_key={WRONG}") as ws:
            assert json.loads(ws.recv(timeout=10))["code"] == "UNAUTHORIZED"
        with connect(
            f"{base}/ws/transcribe", additional_headers={"Authorization": f"Bearer {KEY}"}
        ) as ws:
            assert json.loads(ws.recv(timeout=10))["status"] == "connected"
        with connect(f"{base}/ws/transcribe?%61pi_key={KEY}") as ws:  # the name encoded
            assert json.loads(ws.recv(timeout=10))["status"] == "connected"
        offered = [Subprotocol("token"), Subprotocol(KEY)]  # Deepgram's browser form
        with connect(f"{base}/v1/listen", subprotocols=offered) as ws:
            assert ws.subprotocol == "token"
        offered = [Subprotocol("realtime"), Subprotocol(f"openai-insecure-api-key.{KEY}")]
        with connect(f"{base}/v1/realtime?intent=transcription", subprotocols=offered) as ws:
            assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
        offered = [Subprotocol("realtime"), Subprotocol(f"openai-insecure-api-key.{WRONG}")]
        with connect(f"{base}/v1/realtime?intent=transcription", subprotocols=offered) as ws:
            assert json.loads(ws.recv(timeout=10))["type"] == "error"
    finally:
        output = server.output()
    assert "rid-logs" in output  # the lines were logged...
    assert "/ws/transcribe?api_key=***&request_id=rid-logs" in output  # ...and redacted
    assert "GET /v1/models?api_key=***" in output  # the HTTP access log
    assert "Authorization: Bearer ***" in output or "authorization: Bearer ***" in output
    leaked = [line for line in output.splitlines() if KEY in line or WRONG in line]
    assert not leaked, leaked


def test_a_long_message_is_bounded(lines: list[str]) -> None:
    """User input echoed into a line (a path, a language value) cannot make it unbounded
    (issue 58 §7.9)."""
    logger.warning("unsupported language {!r}", "x" * 100_000)
    logging.getLogger("uvicorn.access").info('"GET /v1/listen?language=%s"', "y" * 100_000)
    assert len(lines) == 2 and all(len(line) < 2100 for line in lines), [len(x) for x in lines]
    assert "more characters)" in lines[0]
