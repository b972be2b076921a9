"""What an engine shows of itself (`Engine.status()`), typed: /health and /metrics read it
instead of asking engines for attributes. Wrappers compose it (a worker adds its process,
DUAL_MODEL adds the fast model's)."""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from typing import Any

# seconds: the buckets of every latency histogram (/metrics)
LATENCY_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


@dataclass(frozen=True)
class HistogramSnapshot:
    """A latency histogram as /metrics shows it: counts per upper bound (not cumulative)
    plus one for the values above the last, their sum and count."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]  # len(bounds) + 1
    total: float

    @property
    def count(self) -> int:
        return sum(self.counts)


@dataclass
class Buckets:
    """A thread-safe latency histogram kept by an engine (the remote backends' latency and
    slot waits), read at scrape time; free of any metrics library."""

    bounds: tuple[float, ...] = LATENCY_BOUNDS
    _counts: list[int] = field(init=False)
    _total: float = field(init=False, default=0.0)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._counts = [0] * (len(self.bounds) + 1)  # the last: above every bound

    def observe(self, value: float) -> None:
        with self._lock:
            self._counts[bisect.bisect_left(self.bounds, value)] += 1  # le: value <= bound
            self._total += value

    def snapshot(self) -> HistogramSnapshot:
        with self._lock:
            return HistogramSnapshot(self.bounds, tuple(self._counts), self._total)


@dataclass(frozen=True)
class WorkerStatus:
    """ENGINE_PROCESS=worker: the child process."""

    pid: int | None
    state: str  # stopped | starting | ready | exited
    restarts: int  # children that died or were killed


@dataclass(frozen=True)
class DiarizerStatus:
    """The speaker diarizer's child process (started by the first diarized request)."""

    pid: int | None
    state: str  # stopped | starting | ready | exited
    restarts: int  # children that died or were killed
    features: str | None  # its filterbank: portable | native (None until it has loaded)


@dataclass(frozen=True)
class EngineStatus:
    name: str
    model_id: str
    device: str
    dtype: str | None = None  # in use, once loaded (Qwen)
    attention: str | None = None
    worker: WorkerStatus | None = None
    backends: tuple[dict[str, Any], ...] = ()  # ENGINE=remote: each backend's state
    backend_waiting: int = 0  # jobs waiting for a backend slot
    # ENGINE=remote: time jobs waited for a backend slot; each backend's answer time by URL
    backend_slot_wait: HistogramSnapshot | None = None
    backend_latency: tuple[tuple[str, HistogramSnapshot], ...] = ()
    fast: EngineStatus | None = None  # DUAL_MODEL: the partials' model
    diarizer: DiarizerStatus | None = None  # the speaker diarizer's process

    @property
    def restarts(self) -> int:
        """Worker processes that died or were killed, the fast model's included."""
        own = self.worker.restarts if self.worker is not None else 0
        return own + (self.fast.restarts if self.fast is not None else 0)
