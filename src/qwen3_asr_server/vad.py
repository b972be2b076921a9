"""Silero VAD (the ONNX model shipped in the `silero-vad` package) on onnxruntime + numpy.

The package itself is never imported: `import silero_vad` imports torch and calls
`torch.set_num_threads(1)` for the whole process. We only read its ONNX file.
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from .engines.base import ModelLoadError
from .pcm import SAMPLE_RATE

FRAME = 512  # samples per VAD frame at 16 kHz (32 ms); the model takes exactly this
CONTEXT = 64  # samples of the previous frame the model expects in front of each frame
VAD_THREADS = 2  # streaming VAD runs here, never on the event loop nor behind decodes
T = TypeVar("T")


def silero_onnx_path() -> Path:
    spec = importlib.util.find_spec("silero_vad")  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "Silero VAD is not installed: pip install 'qwen3-asr-server[vad]' "
            "(or set SEGMENT_VAD=false to cut long audio by energy)."
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx"
    if not path.is_file():
        raise ModelLoadError(f"silero-vad is installed but {path} is missing.")
    return path


class SileroModel:
    """One onnxruntime session, loaded on first use, shared by any number of streams, the
    threads streaming sessions run it on (`run`), and the batcher that runs all the
    streaming sessions' frames together (`batcher`, `vad_batch.py`)."""

    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._session: Any = None
        self._lock = threading.Lock()
        # Threads start on first use; the event loop never takes a lock here.
        self._executor = ThreadPoolExecutor(VAD_THREADS, thread_name_prefix="vad")
        from .vad_batch import VADBatcher  # (it needs this module: imported once it exists)

        self.batcher = VADBatcher(self)  # the streaming sessions' frames, batched

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` (VAD work) on the VAD threads: a big message from one client
        never stalls the event loop, and a long upload's decode never delays the VAD."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def session(self) -> Any:
        with self._lock:
            if self._session is None:
                try:
                    import onnxruntime
                except ImportError as exc:
                    raise ModelLoadError(
                        "Silero VAD needs onnxruntime: pip install 'qwen3-asr-server[vad]'."
                    ) from exc
                opts = onnxruntime.SessionOptions()
                opts.inter_op_num_threads = 1
                opts.intra_op_num_threads = 1
                path = self._path or silero_onnx_path()
                self._session = onnxruntime.InferenceSession(
                    str(path), sess_options=opts, providers=["CPUExecutionProvider"]
                )
            return self._session

    def stream(self) -> VADStream:
        return VADStream(self)


class VADStream:
    """Recurrent state for one audio stream. Not thread-safe; one per session/job."""

    def __init__(self, model: SileroModel) -> None:
        self._model = model
        self.reset()

    def reset(self) -> None:
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros((1, CONTEXT), dtype=np.float32)

    def prob(self, frame: np.ndarray) -> float:
        """Speech probability of one 512-sample frame (float32, 16 kHz)."""
        return float(self.step_many(self._model.session(), [self], [frame])[0])

    @staticmethod
    def step_many(session: Any, streams: list[VADStream], frames: list[np.ndarray]) -> np.ndarray:
        """One frame for each of several streams in one call of the model (its batch axis),
        each in its own state: the probabilities, the same as one call per stream gives."""
        count = len(streams)
        x = np.empty((count, CONTEXT + FRAME), dtype=np.float32)
        state = np.empty((2, count, 128), dtype=np.float32)
        for row, (stream, frame) in enumerate(zip(streams, frames, strict=True)):
            x[row, :CONTEXT] = stream._context[0]
            x[row, CONTEXT:] = frame
            state[:, row] = stream._state[:, 0]
        out, state = session.run(
            None, {"input": x, "state": state, "sr": np.array(SAMPLE_RATE, dtype=np.int64)}
        )
        for row, stream in enumerate(streams):
            stream._state = state[:, row : row + 1].copy()
            stream._context = x[row : row + 1, -CONTEXT:].copy()
        result: np.ndarray = out.reshape(-1)
        return result

    def probs(self, samples: np.ndarray) -> np.ndarray:
        """Probabilities for each whole frame of `samples` (a trailing part frame is ignored)."""
        count = len(samples) // FRAME
        return np.array(
            [self.prob(samples[i * FRAME : (i + 1) * FRAME]) for i in range(count)],
            dtype=np.float32,
        )


def fill_no_speech_probs(model: SileroModel, samples: np.ndarray, segments: list[Any]) -> None:
    """For segments whose engine gave no `no_speech_prob` (Qwen): 1 − the highest VAD speech
    probability over the segment's frames. One VAD pass over the audio the segments cover
    (~0.6% of its duration on 2 CPU cores). Blocking: run it in a thread."""
    missing = [s for s in segments if s.no_speech_prob is None]
    if not missing:
        return
    start = int(min(s.start for s in missing) * SAMPLE_RATE) // FRAME * FRAME
    end = int(max(s.end for s in missing) * SAMPLE_RATE)
    probs = model.stream().probs(samples[start:end])
    for s in missing:
        first = max(0, int(s.start * SAMPLE_RATE) - start) // FRAME
        last = -(-(int(s.end * SAMPLE_RATE) - start) // FRAME)  # ceil: a part frame counts
        window = probs[first:last]
        s.no_speech_prob = round(1.0 - float(window.max()), 4) if len(window) else 1.0
