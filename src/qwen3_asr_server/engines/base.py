"""The Engine protocol and the plain data that crosses it. No heavy imports here."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..errors import ModelLoadError
from ..transcript import Segment, TokenLogprob, TokenUsage
from .status import EngineStatus


class EngineCrashedError(Exception):
    """The engine's worker process died during a call (segfault, OOM kill, kill -9)."""


class EngineInputError(Exception):
    """The engine refused the request's input (a backend answered 400): the client's fault.
    Any other exception from an engine is the server's (a bug is never a 400)."""


class EngineBusyError(Exception):
    """The engine cannot take this call now (a draft model already decoding): the call is
    skipped, not queued inside the engine, where it would hold a scheduler thread."""


class BackendUnavailableError(Exception):
    """No remote backend could take the job; `retry_after` is when one may be back (s)."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class JobCancelledError(Exception):
    """The engine stopped early because every caller of the job had gone (`should_stop`)."""


def engine_errors() -> dict[str, type[Exception]]:
    """The engine errors by class name: how a worker child's error crosses the pipe."""
    kinds = (
        ModelLoadError,
        EngineCrashedError,
        EngineInputError,
        EngineBusyError,
        BackendUnavailableError,
        JobCancelledError,
    )
    return {kind.__name__: kind for kind in kinds}


ALIGNER_MAX_SECONDS = 180.0  # the forced aligner's limit per call (the SDK's own chunk size)

ShouldStop = Callable[[], bool]
"""Polled by an engine during a call: True once nobody waits for the result any more."""


def never_stop() -> bool:
    return False


@dataclass(frozen=True)
class TranscribeRequest:
    audio: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # 16 kHz mono
    language: str | None = None  # ISO-639-1 code, None = detect
    prompt: str | None = None
    temperature: float | None = None
    word_timestamps: bool = False
    # Segment start/end times wanted (verbose_json, srt, vtt, the seed's SSE). A text-only
    # answer (json, text, stream=true) lets whisper's batched decoder skip timestamp tokens.
    segment_times: bool = True
    draft: bool = False  # a streaming partial, replaced soon: speed may cost some accuracy
    partial: bool = False  # a streaming partial (DUAL_MODEL runs it on the fast model)
    # One segment of a longer file: decoded the same way alone or in a batch, so that the
    # file's text does not depend on how its segments happened to be grouped.
    long_form: bool = False
    keywords: tuple[str, ...] = ()  # words or phrases to bias recognition towards
    languages: tuple[str, ...] = ()  # candidate ISO codes for detection; () = any
    logprobs: bool = False  # wanted: each generated text token's log probability
    # A quiet segment of an upload that voice detection must clear first, where the engine
    # runs (ENGINE_PROCESS=worker: its child, so the server never loads onnxruntime for it);
    # if it hears no speech the answer is empty text. Inline engines never get one.
    quiet: bool = False


@dataclass
class TranscribeResult:
    text: str
    language: str | None  # ISO-639-1 code when known
    segments: list[Segment] = field(default_factory=list)
    engine_seconds: float = 0.0  # time spent inside the engine
    # A draft's words, each with the lowest probability of its tokens (None: not known)
    word_probs: list[tuple[str, float]] | None = None
    logprobs: list[TokenLogprob] | None = None  # when the request asked and the engine can
    usage: TokenUsage | None = None  # when the engine counts tokens


class RowSource(Protocol):
    """Where a stepping engine's rows come from and where their answers go (the scheduler,
    or a list for one `transcribe_batch` call). Handles are the source's own names."""

    def take(self, free: int) -> list[tuple[object, TranscribeRequest]]:
        """Up to `free` new rows, the most urgent first ([] when none waits). Asked between
        steps, also with no slot free (the source may then make rows leave, through `gone`,
        for more urgent ones); the first ask of a `decode_rows` call has every slot free."""
        ...

    def gone(self, handle: object) -> bool:
        """Nobody waits for this row any more: it leaves at the next step."""
        ...

    def done(
        self, handle: object, result: TranscribeResult | None, error: Exception | None
    ) -> None:
        """The row's answer, as soon as it has one."""
        ...

    def stepped(self, rows: int) -> None:
        """A decode step ran with `rows` rows (metrics)."""
        ...


class Engine(Protocol):
    """What the model manager and scheduler need from an ASR backend.

    `load`/`unload`/`transcribe` are blocking and run on worker threads; constructing an
    engine must stay cheap and import nothing heavy.
    """

    name: str
    model_id: str

    @property
    def long_form_batches(self) -> bool:
        """A long file's segments may share `transcribe_batch` calls without changing its
        text (the service then keeps MAX_BATCH_SIZE + 1 of them in flight)."""
        ...

    @property
    def device(self) -> str: ...

    @property
    def languages(self) -> frozenset[str] | None:
        """ISO codes the engine can be forced to; None means any."""
        ...

    @property
    def word_timestamps(self) -> str:
        """Where word times come from: `native`, `aligner`, or `estimate` (spread)."""
        ...

    def load(self) -> None: ...

    def unload(self) -> None: ...

    def transcribe(
        self, request: TranscribeRequest, should_stop: ShouldStop = never_stop
    ) -> TranscribeResult: ...

    def batch_key(self, request: TranscribeRequest) -> Hashable | None:
        """Requests with equal keys may share one `transcribe_batch` call; None: never."""
        ...

    def transcribe_batch(
        self, requests: list[TranscribeRequest], should_stop: ShouldStop = never_stop
    ) -> list[TranscribeResult]: ...

    @property
    def steps(self) -> bool:
        """Decodes step by step with rows joining and leaving between steps
        (`decode_rows`); False: only whole calls (`transcribe_batch`)."""
        ...

    def decode_rows(self, source: RowSource) -> None:
        """Decode rows from `source` until it has none left; each row is answered through
        `source.done` as soon as it ends. Only for engines whose `steps` is True."""
        ...

    @property
    def capacity(self) -> int:
        """Calls it can run at once (the scheduler's threads): 1 for a model in this process
        or a worker; the backends' total for remote ones."""
        ...

    def status(self) -> EngineStatus:
        """What /health and /metrics show of it; wrappers compose their inner engine's."""
        ...


class WholeCalls:
    """What engines that decode whole calls only (no rows joining between steps) say."""

    steps = False

    def decode_rows(self, source: RowSource) -> None:
        raise NotImplementedError(f"{type(self).__name__} decodes whole calls only")
