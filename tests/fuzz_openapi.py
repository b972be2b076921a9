"""Property-based requests from the server's own OpenAPI schema (schemathesis) against a real
uvicorn: whatever a client sends, no route answers 5xx other than the documented
501/503/504,
and every error is OpenAI's shape.

Run by tests/test_schemathesis.py in a fresh process: libraries built with -ffast-math
(loaded by other tests) switch the CPU's subnormal floats off in the thread that loads them,
and Hypothesis refuses to generate floats then."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import response_schema_conformance, status_code_conformance

from helpers import whisper_settings
from qwen3_asr_server.app import create_app
from server import LiveServer, live_server

pytestmark = pytest.mark.slow

SETTINGS = whisper_settings(max_audio_seconds=30)
schema = schemathesis.openapi.from_dict(create_app(SETTINGS).openapi())


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(create_app(SETTINGS)) as srv:
        yield srv


@schema.parametrize()
@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
    derandomize=True,
)
def test_no_undocumented_server_errors(case: schemathesis.Case, server: LiveServer) -> None:
    response = case.call(base_url=server.url, timeout=60)
    # Every status is documented for its route, and every error body matches the Error schema.
    case.validate_response(response, checks=[status_code_conformance, response_schema_conformance])
    status = response.status_code
    # Documented: 501 translation not configured, 503 busy/unavailable, 504 timeout.
    assert status < 500 or status in (501, 503, 504), (status, response.text[:500])
    assert response.headers.get("x-request-id")
    if status >= 400:
        body = response.json()
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
        assert body["error"]["message"]
