"""Wrappers around a real engine for tests that need to see or steer its calls."""

from __future__ import annotations

import threading
import time
from typing import Any


class Recording:
    """Delegates to a real engine; records each job's audio length (`calls`) and each
    engine call's batch size (`batch_sizes`), can fail or slow one."""

    def __init__(
        self, engine: Any, fail_on: int | None = None, delay: float = 0.0, tag: str = ""
    ) -> None:
        self.inner = engine
        self.name, self.model_id = engine.name, engine.model_id
        self.fail_on = fail_on
        self.delay = delay
        self.calls: list[float] = []
        self.batch_sizes: list[int] = []
        self.texts: list[str] = []  # each result's text, in order
        self.kinds: list[tuple[bool, bool]] = []  # each job's (partial, draft)
        self.lock = threading.Lock()

    def __getattr__(self, item: str) -> Any:
        return getattr(self.inner, item)

    def _record(self, requests: list[Any]) -> None:
        with self.lock:
            first = len(self.calls) + 1
            self.calls.extend(len(r.audio) / 16000 for r in requests)
            self.kinds.extend((r.partial, r.draft) for r in requests)
            self.batch_sizes.append(len(requests))
            number = len(self.calls)
        if self.fail_on is not None and first <= self.fail_on <= number:
            raise RuntimeError(f"engine failure on call {self.fail_on}")
        time.sleep(self.delay)

    def transcribe(self, request: Any, should_stop: Any = None) -> Any:
        self._record([request])
        if should_stop is None:
            result = self.inner.transcribe(request)
        else:
            result = self.inner.transcribe(request, should_stop)
        self.texts.append(result.text)
        return result

    def transcribe_batch(self, requests: list[Any], should_stop: Any = None) -> Any:
        self._record(requests)
        if should_stop is None:
            return self.inner.transcribe_batch(requests)
        return self.inner.transcribe_batch(requests, should_stop)

    def decode_rows(self, source: Any) -> None:
        """Qwen's step loop: the rows are recorded as they join, their texts as they end."""
        outer = self

        class Recorded:
            def __getattr__(self, item: str) -> Any:
                return getattr(source, item)

            def take(self, free: int) -> Any:
                rows = source.take(free)
                if rows:
                    outer._record([request for _, request in rows])
                return rows

            def done(self, handle: Any, result: Any, error: Any) -> None:
                if result is not None:
                    outer.texts.append(result.text)
                source.done(handle, result, error)

        self.inner.decode_rows(Recorded())


class GatedLoad(Recording):
    """A real engine whose `load()` first waits for `gate` (a stalled download, a child stuck
    in from_pretrained), up to `wait` seconds."""

    def __init__(self, engine: Any, wait: float = 120.0) -> None:
        super().__init__(engine)
        self.gate = threading.Event()
        self.wait = wait

    def load(self) -> None:
        self.gate.wait(self.wait)
        self.inner.load()


class Capturing(Recording):
    """A real engine that keeps every request it was given (without its audio)."""

    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        self.requests: list[Any] = []

    def _record(self, requests: list[Any]) -> None:
        self.requests.extend(requests)
        super()._record(requests)
