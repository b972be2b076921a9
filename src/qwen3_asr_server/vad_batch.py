"""Voice detection for every live stream in as few ONNX calls as possible.

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

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

import numpy as np

from .vad import FRAME, SileroModel, VADStream, run_streams

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
    """Batches the streaming sessions' VAD requests (one per app, on its event loop)."""

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
