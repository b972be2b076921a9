"""DUAL_MODEL: a fast model for streaming partials beside the main model for everything else.

Both load and unload together (the model manager sees one engine). Any pair works: two Qwen
checkpoints, or whisper for partials under a Qwen main model.

It is the main engine (capacity, backends with ENGINE=remote) for everything but partials;
its status carries both models' (worker restarts of both).
The fast model takes one call at a time (a lock) even when the main one takes several.
"""

from __future__ import annotations

import threading
from dataclasses import replace

from .base import (
    Engine,
    EngineBusyError,
    ShouldStop,
    TranscribeRequest,
    TranscribeResult,
    never_stop,
)
from .status import EngineStatus
from .wrapping import EngineWrapper


class DualEngine(EngineWrapper):
    """The main engine, except that partials go to `fast`; its status shows both."""

    stepping = False  # two engines: whole calls, each to its engine

    def __init__(self, main: Engine, fast: Engine) -> None:
        super().__init__(main)
        self.main, self.fast = main, fast
        self._fast_lock = threading.Lock()  # the scheduler may run `capacity` calls at once

    def status(self) -> EngineStatus:
        """The main engine's (its backends with ENGINE=remote), with the fast model's."""
        return replace(self.main.status(), fast=self.fast.status())

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
