"""What an engine shows of itself (`Engine.status()`), typed: /health and /metrics read it
instead of asking engines for attributes. Wrappers compose it (a worker adds its process,
DUAL_MODEL adds the fast model's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WorkerStatus:
    """ENGINE_PROCESS=worker: the child process."""

    pid: int | None
    state: str  # stopped | starting | ready | exited
    restarts: int  # children that died or were killed


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
    fast: EngineStatus | None = None  # DUAL_MODEL: the partials' model

    @property
    def restarts(self) -> int:
        """Worker processes that died or were killed, the fast model's included."""
        own = self.worker.restarts if self.worker is not None else 0
        return own + (self.fast.restarts if self.fast is not None else 0)
