"""Wrappers around a real engine for tests that need to see or steer its calls."""

from __future__ import annotations

import threading
import time
from typing import Any


class Recording:
    """Delegates to a real engine; records each call's audio length, can fail or slow one."""

    def __init__(
        self, engine: Any, fail_on: int | None = None, delay: float = 0.0, tag: str = ""
    ) -> None:
        self.inner = engine
        self.name, self.model_id = engine.name, engine.model_id
        self.fail_on = fail_on
        self.delay = delay
        self.calls: list[float] = []
        self.lock = threading.Lock()

    def __getattr__(self, item: str) -> Any:
        return getattr(self.inner, item)

    def transcribe(self, request: Any, should_stop: Any = None) -> Any:
        with self.lock:
            self.calls.append(len(request.audio) / 16000)
            number = len(self.calls)
        if self.fail_on is not None and number == self.fail_on:
            raise RuntimeError(f"engine failure on call {number}")
        time.sleep(self.delay)
        if should_stop is None:
            return self.inner.transcribe(request)
        return self.inner.transcribe(request, should_stop)
