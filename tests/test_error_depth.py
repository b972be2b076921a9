"""Errors at the right depth: the core imports no web framework and raises domain errors
that know no HTTP; one table in api/ gives their statuses and OpenAI bodies; only an
engine's explicit input error becomes a 400 (a bug in an engine is a 500, never the
client's fault). The engine here is a stand-in (a unit test of the service's error mapping)."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qwen3_asr_server import errors
from qwen3_asr_server.api.disconnect import ClientClosedError
from qwen3_asr_server.api.error_table import http_headers, http_status, openai_body
from qwen3_asr_server.audio.decode import Audio
from qwen3_asr_server.audio.segmentation import Segmenter
from qwen3_asr_server.config import Settings
from qwen3_asr_server.engines.base import EngineInputError, engine_errors
from qwen3_asr_server.errors import ServiceError
from qwen3_asr_server.runtime.lifecycle import ModelManager
from qwen3_asr_server.runtime.scheduler import PriorityScheduler
from qwen3_asr_server.transcription.service import Options, Transcriber

INVALID, SERVER = "invalid_request_error", "server_error"


@pytest.mark.parametrize(
    ("error", "status", "type_", "code", "retry_after"),
    [
        (errors.BadRequestError("m"), 400, INVALID, None, None),
        (errors.InvalidAudioError("m"), 400, INVALID, "invalid_audio", None),
        (errors.AuthError("m"), 401, INVALID, "invalid_api_key", None),
        (errors.NotFoundError("m"), 404, INVALID, "not_found", None),
        (errors.TooLargeError("m"), 413, INVALID, "too_large", None),
        (ClientClosedError("m"), 499, INVALID, "client_closed_request", None),
        (errors.ServiceError("m"), 500, SERVER, None, None),
        (errors.InferenceError("m"), 500, SERVER, "inference_failed", None),
        (errors.NotConfiguredError("m"), 501, SERVER, "not_configured", None),
        (errors.UpstreamError("m"), 502, SERVER, "upstream_failed", None),
        (errors.UnavailableError("m", code="shutting_down"), 503, SERVER, "shutting_down", 1),
        (errors.UnavailableError("m", code="x", retry_after=7), 503, SERVER, "x", 7),
        (errors.QueueFullError(), 503, SERVER, "queue_full", 1),
        (errors.ModelUnavailableError("m"), 503, SERVER, "model_unavailable", 10),
        (errors.RequestTimeoutError("m"), 504, SERVER, "timeout", None),
    ],
)
def test_the_table_gives_each_domain_error_its_status_body_and_headers(
    error: ServiceError, status: int, type_: str, code: str | None, retry_after: int | None
) -> None:
    assert error.retry_after == retry_after
    assert http_status(error) == status
    message = error.message
    assert openai_body(error) == {
        "error": {"message": message, "type": type_, "param": None, "code": code}
    }
    assert http_headers(error) == ({} if retry_after is None else {"Retry-After": str(retry_after)})


def test_no_domain_error_carries_http() -> None:
    for name in dir(errors):
        cls = getattr(errors, name)
        if isinstance(cls, type) and issubclass(cls, ServiceError):
            assert not {"status", "type", "headers", "body"} & set(dir(cls)), name
    # and nothing outside api/ reads an HTTP status, type or headers off one
    package = Path(errors.__file__).parent
    for path in package.rglob("*.py"):
        if "api" in path.relative_to(package).parts:
            continue
        text = path.read_text()
        reads = re.findall(r"\b(?:exc|error|err)\.(?:status|type|headers|body)\b", text)
        assert not reads, (path, reads)


def test_the_core_imports_no_web_framework() -> None:
    code = (
        "import sys; import qwen3_asr_server.runtime.scheduler, "
        "qwen3_asr_server.transcription.service, qwen3_asr_server.runtime.lifecycle, "
        "qwen3_asr_server.audio.budget, qwen3_asr_server.audio.decode; "
        "print(sorted(m for m in ('fastapi', 'starlette', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


class Failing:
    name, model_id, device, languages = "failing", "failing", "cpu", None
    long_form_batches = False
    capacity = 1

    def __init__(self, error: Exception) -> None:
        self.error = error

    def load(self) -> None: ...

    def unload(self) -> None: ...

    def transcribe(self, request: Any, should_stop: Any = None) -> Any:
        raise self.error

    def batch_key(self, request: Any) -> None:
        return None


@pytest.mark.parametrize(
    ("error", "status"),
    [(ValueError("a bug deep in the engine"), 500), (EngineInputError("bad input"), 400)],
)
async def test_only_an_explicit_input_error_is_the_clients(error: Exception, status: int) -> None:
    scheduler = PriorityScheduler(max_queue=4)
    scheduler.start()
    manager = ModelManager(Failing(error), idle_timeout=0)  # type: ignore[arg-type]
    settings = Settings(_env_file=None, idle_timeout=0)  # type: ignore[call-arg]
    service = Transcriber(settings, manager, scheduler, Segmenter(30, vad=None))
    try:
        with pytest.raises(ServiceError) as info:
            await service.transcribe(Audio(np.zeros(16000, np.float32), 16000), Options())
        assert http_status(info.value) == status
    finally:
        await asyncio.to_thread(scheduler.stop)
        await manager.stop()


def test_engine_errors_cross_the_worker_pipe_by_name() -> None:
    table = engine_errors()
    assert table["EngineInputError"] is EngineInputError
    assert "ValueError" not in table  # a child's ValueError is a RuntimeError here: a 500
