"""Silero VAD (the ONNX model shipped in the `silero-vad` package) on onnxruntime + numpy.

The package itself is never imported: `import silero_vad` imports torch and calls
`torch.set_num_threads(1)` for the whole process. We only read its ONNX file. Uploads run
one stream at a time (segment cuts, the silence check); live sessions' frames go through one
batcher (`VADBatcher`) that runs every session's frames together.
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..errors import ModelLoadError
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
    streaming sessions' frames together (`batcher`, below)."""

    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._session: Any = None
        self._lock = threading.Lock()
        # Threads start on first use; the event loop never takes a lock here.
        self._executor = ThreadPoolExecutor(VAD_THREADS, thread_name_prefix="vad")
        from .vad import VADBatcher  # (it needs this module: imported once it exists)

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
        return float(self.probs(frame)[0])

    def probs(self, samples: np.ndarray) -> np.ndarray:
        """Probabilities for each whole frame of `samples` (a trailing part frame is ignored)."""
        return run_streams(self._model.session(), [self], [samples])[0]


def run_streams(
    session: Any, streams: list[VADStream], audio: list[np.ndarray]
) -> list[np.ndarray]:
    """The speech probability of each whole frame of `audio[i]` in `streams[i]`'s state, for
    several streams at once: step k is one call of the model (its batch axis) over the k-th
    frame of every stream that has one. The same numbers as one call per frame and stream.
    Streams must be distinct (their frames run in order)."""
    counts = [len(a) // FRAME for a in audio]
    order = sorted(range(len(streams)), key=lambda i: -counts[i])  # active rows: a prefix
    rows, steps = len(order), max(counts, default=0)
    frames = np.zeros((rows, steps, FRAME), dtype=np.float32)
    state = np.empty((2, rows, 128), dtype=np.float32)
    context = np.empty((rows, CONTEXT), dtype=np.float32)
    for row, i in enumerate(order):
        frames[row, : counts[i]] = audio[i][: counts[i] * FRAME].reshape(-1, FRAME)
        state[:, row] = streams[i]._state[:, 0]
        context[row] = streams[i]._context[0]
    probs = np.zeros((rows, steps), dtype=np.float32)
    rate = np.array(SAMPLE_RATE, dtype=np.int64)
    ordered = np.array([counts[i] for i in order])
    for k in range(steps):
        active = int(np.count_nonzero(ordered > k))
        x = np.concatenate([context[:active], frames[:active, k]], axis=1)
        live = np.ascontiguousarray(state[:, :active])
        out, state[:, :active] = session.run(None, {"input": x, "state": live, "sr": rate})
        context[:active] = x[:, -CONTEXT:]
        probs[:active, k] = out.reshape(-1)
    result: list[np.ndarray] = [np.zeros(0, np.float32)] * len(streams)
    for row, i in enumerate(order):
        streams[i]._state = state[:, row : row + 1].copy()
        streams[i]._context = context[row : row + 1].copy()
        result[i] = probs[row, : counts[i]].copy()
    return result


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


SPEECH_PROB = 0.5  # Silero's own threshold for speech
MIN_SPEECH_FRAMES = 3  # ~100 ms of it in a row: shorter is a click, not a word
SILENT_PEAK = 1e-4  # -80 dBFS: digital silence, no model call needed
LOUD_RMS = 0.018  # -35 dBFS over 32 ms: loud enough that the segment may hold speech


def may_be_silent(samples: np.ndarray) -> bool:
    """No 32 ms of `samples` reaches -35 dBFS (RMS): near-silence, room noise, or quiet
    speech, which voice detection must tell apart. Louder audio goes to the model as it is,
    so an upload of ordinary speech never loads the VAD (~45 MB in the server process)."""
    frames = len(samples) // FRAME
    if frames == 0:
        return True
    power = np.square(samples[: frames * FRAME].reshape(frames, FRAME), dtype=np.float32)
    return float(np.sqrt(power.mean(axis=1).max())) < LOUD_RMS


def has_speech(model: SileroModel, samples: np.ndarray, chunk_frames: int = 32) -> bool:
    """Whether voice detection hears speech anywhere in `samples`: ~100 ms above Silero's
    threshold in a row. Stops at the first speech found, so speech costs a frame or a few;
    only a silent stretch is read to its end. Blocking: run it on the VAD threads."""
    if not len(samples) or float(np.max(np.abs(samples))) < SILENT_PEAK:
        return False
    stream = model.stream()
    run = 0
    step = chunk_frames * FRAME
    for start in range(0, len(samples), step):
        piece = samples[start : start + step]
        if len(piece) < FRAME:  # a part frame at the end: padded, as a segment is decoded
            piece = np.pad(piece, (0, FRAME - len(piece)))
        for prob in stream.probs(piece):
            run = run + 1 if prob >= SPEECH_PROB else 0
            if run >= MIN_SPEECH_FRAMES:
                return True
    return False


def may_hold_speech(model: SileroModel, samples: np.ndarray) -> bool:
    """False only for a quiet segment in which voice detection hears no speech: what an
    upload's segment must be to skip the model. Blocking: run it on the VAD threads."""
    return not may_be_silent(samples) or has_speech(model, samples)


MAX_FRAMES = 32  # frames of one request per batch (~1 s): a long message goes in pieces


@dataclass
class _Request:
    stream: VADStream
    frames: np.ndarray  # whole frames, float32 at 16 kHz
    future: asyncio.Future[np.ndarray]
    arrived: float  # time.monotonic() when the request was made


@dataclass
class VADStats:
    """What /metrics shows of the streaming VAD (read at scrape time)."""

    seconds: float = 0.0  # thread time inside the batched runs
    frames: int = 0
    calls: int = 0  # model calls (frames / calls: streams per call)
    waiting: int = 0  # requests waiting for the next batch now
    oldest_wait: float = 0.0  # seconds the oldest waiting or running request has waited


class VADStopped(RuntimeError):
    """The VAD was shut down (the app is stopping) with this request unanswered."""


class VADBatcher:
    """Batches the streaming sessions' VAD requests (one per app, on its event loop): voice
    detection for every live stream in as few ONNX calls as possible.

    Each streaming session asks for the speech probabilities of the frames of one message. One
    call of Silero's ONNX model per 32 ms frame per stream costs ~0.07–0.22 ms here, plus a hop
    to a thread and back for every message; one call over many streams' frames costs ~0.03 ms
    a frame (the model takes a batch: state [2, B, 128]). So the requests that arrive while a
    batch runs wait for the next one and all go together: nothing waits on a timer, a lone
    stream runs at once, and the busier the front, the bigger (and cheaper) the batches.

    The frames of one stream must run in order (the model is recurrent), so a stream with two
    requests waiting (it should not happen: a session feeds one message at a time) has the
    second deferred to the next batch. A request whose caller was cancelled still runs: its
    stream's state then matches the audio it has seen, as with one call per frame. A long
    message (a client may send ~2 minutes of G.711 in one) goes in pieces of MAX_FRAMES, one per
    batch, so the other streams never wait for all of it.
    """

    def __init__(self, model: SileroModel) -> None:
        self._model = model
        self._waiting: list[_Request] = []
        self._running: list[_Request] = []
        self._task: asyncio.Task[None] | None = None
        self._lock = threading.Lock()  # the stats are read by /metrics, written on a thread
        self._seconds = 0.0
        self._frames = 0
        self._calls = 0

    async def probs(self, stream: VADStream, frames: np.ndarray) -> np.ndarray:
        """Speech probability of each whole frame of `frames`, in `stream`'s state. A long
        message goes in pieces of MAX_FRAMES, one per batch, so that it never holds up the
        other streams' frames for more than a piece."""
        if len(frames) <= MAX_FRAMES * FRAME:
            return await self._one(stream, frames)
        pieces = range(0, len(frames) - len(frames) % FRAME, MAX_FRAMES * FRAME)
        parts = [await self._one(stream, frames[i : i + MAX_FRAMES * FRAME]) for i in pieces]
        return np.concatenate(parts)

    async def _one(self, stream: VADStream, frames: np.ndarray) -> np.ndarray:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[np.ndarray] = loop.create_future()
        self._waiting.append(_Request(stream, frames, future, time.monotonic()))
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._drain())
        return await future

    def stats(self) -> VADStats:
        with self._lock:
            seconds, frames, calls = self._seconds, self._frames, self._calls
        pending = self._waiting + self._running  # (a copy: no iteration over a live list)
        oldest = min((r.arrived for r in pending), default=None)
        wait = 0.0 if oldest is None else time.monotonic() - oldest
        return VADStats(seconds, frames, calls, len(self._waiting), wait)

    async def _drain(self) -> None:
        try:
            while self._waiting:
                batch: list[_Request] = []
                later: list[_Request] = []
                seen: set[int] = set()
                for request in self._waiting:
                    (later if id(request.stream) in seen else batch).append(request)
                    seen.add(id(request.stream))
                self._waiting, self._running = later, batch
                try:
                    results = await self._model.run(self._run, batch)
                except Exception as exc:  # the model failed to load: every caller hears it
                    for request in batch:
                        if not request.future.done():
                            request.future.set_exception(exc)
                else:
                    for request, result in zip(batch, results, strict=True):
                        if not request.future.done():
                            request.future.set_result(result)
                self._running = []
        finally:  # shut down (the VAD's threads stopped) or a bug: no caller waits for ever
            for request in self._running + self._waiting:
                if not request.future.done():
                    request.future.set_exception(VADStopped("voice detection stopped"))
            self._waiting, self._running = [], []

    def _run(self, batch: list[_Request]) -> list[np.ndarray]:
        """On a VAD thread: every request's frames, one model call per frame step."""
        started = time.thread_time()
        session = self._model.session()
        out = run_streams(session, [r.stream for r in batch], [r.frames for r in batch])
        with self._lock:
            self._seconds += time.thread_time() - started
            self._frames += sum(len(p) for p in out)
            self._calls += max((len(p) for p in out), default=0)
        return out
