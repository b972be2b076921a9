"""What engines that wrap another share: forward everything to `inner`, override what
differs (DUAL_MODEL's pair, the worker-process proxy). And the one way an engine waits on
something outside it (a child process, an HTTP request) while its callers may leave."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .base import (
    Engine,
    RowSource,
    ShouldStop,
    TranscribeRequest,
    TranscribeResult,
    never_stop,
)
from .status import EngineStatus

POLL = 0.05  # seconds between checks of `should_stop` while waiting


class EngineWrapper:
    """An engine made of another: every member is `inner`'s until a subclass says
    otherwise."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner

    # read through, not copied: a remote engine learns its model id from the backends, and
    # a Qwen engine's default depends on the device it finds at load
    @property
    def name(self) -> str:
        return self.inner.name

    @name.setter
    def name(self, value: str) -> None:
        self.inner.name = value

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    @model_id.setter
    def model_id(self, value: str) -> None:
        self.inner.model_id = value

    @property
    def device(self) -> str:
        return self.inner.device

    @property
    def languages(self) -> frozenset[str] | None:
        return self.inner.languages

    @property
    def word_timestamps(self) -> str:
        return self.inner.word_timestamps

    @property
    def long_form_batches(self) -> bool:
        return self.inner.long_form_batches

    @property
    def capacity(self) -> int:
        return self.inner.capacity

    def status(self) -> EngineStatus:
        return self.inner.status()

    def load(self) -> None:
        self.inner.load()

    def unload(self) -> None:
        self.inner.unload()

    def batch_key(self, request: TranscribeRequest) -> Hashable | None:
        return self.inner.batch_key(request)

    def transcribe(
        self, request: TranscribeRequest, should_stop: ShouldStop = never_stop
    ) -> TranscribeResult:
        return self.inner.transcribe(request, should_stop)

    def transcribe_batch(
        self, requests: list[TranscribeRequest], should_stop: ShouldStop = never_stop
    ) -> list[TranscribeResult]:
        return self.inner.transcribe_batch(requests, should_stop)

    stepping = True  # False in a wrapper that cannot hand rows to `inner` between steps

    @property
    def steps(self) -> bool:
        return self.stepping and self.inner.steps

    def decode_rows(self, source: RowSource) -> None:
        if not self.steps:
            raise NotImplementedError(f"{type(self).__name__} decodes whole calls only")
        self.inner.decode_rows(source)


@runtime_checkable
class HearsSpeech(Protocol):
    """An engine whose model runs in another process that has voice detection of its own
    (the worker proxy)."""

    def speech_probs(self, samples: np.ndarray) -> np.ndarray: ...


SpeechProbs = Callable[[np.ndarray], np.ndarray]


def speech_prober(engine: Any) -> SpeechProbs | None:
    """Where `engine`'s voice detection runs when its model is in a worker process: that
    process's (the pause search of a long upload and a call's turns then never load
    onnxruntime into the server). None: here, in the server process."""
    while engine is not None:
        if isinstance(engine, HearsSpeech):
            return engine.speech_probs
        engine = getattr(engine, "inner", None)
    return None


def wait_or_cancel(
    ready: Callable[[float], bool],
    should_stop: ShouldStop,
    on_stop: Callable[[], None],
    check: Callable[[float | None], None] | None = None,
) -> None:
    """Block until `ready(POLL)` (which waits up to POLL seconds) is true. The first time
    `should_stop()` says every caller has gone, `on_stop()` runs (it may raise to give up
    at once, or ask the other side to stop). `check(stop_asked)` runs every poll and may
    raise: the other side died, or it is overdue (`stop_asked`: when on_stop ran)."""
    stop_asked: float | None = None
    while not ready(POLL):
        if stop_asked is None and should_stop():
            stop_asked = time.monotonic()
            on_stop()
        if check is not None:
            check(stop_asked)
