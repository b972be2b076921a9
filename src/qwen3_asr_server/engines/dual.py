"""DUAL_MODEL: a fast model for streaming partials beside the main model for everything else.

Both load and unload together (the model manager sees one engine). Any pair works: two Qwen
checkpoints, or whisper for partials under a Qwen main model.

The pair shows what the server needs of the engines inside it: the main engine's slots (the
remote backends' capacity with ENGINE=remote) and backends, and the worker restarts of both.
The fast model takes one call at a time (a lock) even when the main one takes several.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Any

from .base import (
    Engine,
    EngineBusyError,
    ShouldStop,
    TranscribeRequest,
    TranscribeResult,
    never_stop,
)


class DualEngine:
    def __init__(self, main: Engine, fast: Engine) -> None:
        self.main, self.fast = main, fast
        self.name, self.model_id = main.name, main.model_id
        self._fast_lock = threading.Lock()  # the scheduler may run `slots` calls at once

    @property
    def slots(self) -> int:
        """Engine calls at once: the main engine's (remote backends: their capacity)."""
        return int(getattr(self.main, "slots", 1))

    @property
    def restarts(self) -> int:
        """ENGINE_PROCESS=worker: worker processes of both models that died or were killed."""
        return sum(int(getattr(e, "restarts", 0)) for e in (self.main, self.fast))

    @property
    def backends(self) -> list[Any]:
        """ENGINE=remote: the main engine's backends (the fast model is always local)."""
        return list(getattr(self.main, "backends", []))

    def status(self) -> list[dict[str, Any]]:
        status = getattr(self.main, "status", None)
        return list(status()) if callable(status) else []

    @property
    def backend_waiting(self) -> int:
        return int(getattr(self.main, "backend_waiting", 0))

    @property
    def device(self) -> str:
        return self.main.device

    @property
    def languages(self) -> frozenset[str] | None:
        return self.main.languages

    @property
    def word_timestamps(self) -> str:
        return self.main.word_timestamps

    @property
    def long_form_batches(self) -> bool:
        return self.main.long_form_batches

    def load(self) -> None:
        self.main.load()
        try:
            self.fast.load()
        except BaseException:
            self.main.unload()  # both or neither: a half-loaded pair would hide the error
            raise

    def unload(self) -> None:
        try:
            self.fast.unload()
        finally:
            self.main.unload()

    def for_request(self, request: TranscribeRequest) -> Engine:
        """Partials go to the fast model, unless it cannot take their language (an
        English-only fast model takes a session only when its language is set to English)."""
        languages = self.fast.languages
        fits = languages is None or (request.language is not None and request.language in languages)
        return self.fast if request.partial and fits else self.main

    def transcribe(
        self, request: TranscribeRequest, should_stop: ShouldStop = never_stop
    ) -> TranscribeResult:
        engine = self.for_request(request)
        if engine is self.main:
            return engine.transcribe(request, should_stop)
        # With remote backends the scheduler runs several calls at once; partials waiting
        # here for the one local fast model would hold its threads from finals and uploads
        # that the backends could take. A partial is a draft: skip it instead.
        if not self._fast_lock.acquire(blocking=False):
            raise EngineBusyError("the fast model is decoding another partial")
        try:
            return engine.transcribe(request, should_stop)
        finally:
            self._fast_lock.release()

    def batch_key(self, request: TranscribeRequest) -> Hashable | None:
        return self.main.batch_key(request)  # partials are never batched

    def transcribe_batch(
        self, requests: list[TranscribeRequest], should_stop: ShouldStop = never_stop
    ) -> list[TranscribeResult]:
        return self.main.transcribe_batch(requests, should_stop)
