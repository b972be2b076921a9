"""Errors at the right depth: the core imports no web framework, and only an engine's
explicit input error becomes a 400 (a bug in an engine is a 500, never the client's fault).
The engine here is a stand-in (a unit test of the service's error mapping)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from qwen3_asr_server.audio import Audio
from qwen3_asr_server.config import Settings
from qwen3_asr_server.engines.base import EngineInputError, engine_errors
from qwen3_asr_server.errors import APIError
from qwen3_asr_server.lifecycle import ModelManager
from qwen3_asr_server.scheduler import PriorityScheduler
from qwen3_asr_server.segmentation import Segmenter
from qwen3_asr_server.service import Options, Transcriber


def test_the_core_imports_no_web_framework() -> None:
    code = (
        "import sys; import qwen3_asr_server.scheduler, qwen3_asr_server.service, "
        "qwen3_asr_server.lifecycle, qwen3_asr_server.budget, qwen3_asr_server.audio; "
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
        with pytest.raises(APIError) as info:
            await service.transcribe(Audio(np.zeros(16000, np.float32), 16000), Options())
        assert info.value.status == status
    finally:
        await asyncio.to_thread(scheduler.stop)
        await manager.stop()


def test_engine_errors_cross_the_worker_pipe_by_name() -> None:
    table = engine_errors()
    assert table["EngineInputError"] is EngineInputError
    assert "ValueError" not in table  # a child's ValueError is a RuntimeError here: a 500
