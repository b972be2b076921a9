"""The engine in a child process (ENGINE_PROCESS=worker, the seed's GATEWAY_MODE).

`WorkerEngine` is one more Engine: the scheduler calls it like an inline engine, and it
forwards each call over a pipe to a child started with spawn (never fork) on `load()` and
ended on `unload()`, so an idle unload gives back everything the model runtime took (torch,
the CUDA context). The server process never imports torch.

- Audio crosses as raw float32 bytes (`send_bytes`), the rest as small pickled tuples.
- Cancellation: a shared event the child's engine polls as `should_stop`.
- A child that dies (segfault, OOM kill, kill -9) fails the calls in flight with
  `EngineCrashedError` (a 503); the next call starts a fresh child. A thread waits on each
  child's sentinel, so a death between calls shows at once (`state` "exited" in /health).
- A job whose callers are gone but whose generation does not stop within `kill_grace`
  seconds, or that runs past `hard_timeout`, is killed with its child.
- The child exits when its parent dies (it watches its parent pid), so no orphan survives.
- The silence gate of an upload's quiet segments (`TranscribeRequest.quiet`), the pause
  search of a long upload and a call's turns (`speech_probs`) run here, in the child, with
  its own voice detection: onnxruntime never loads into the server process for an upload,
  so the idle unload gives its memory back too.
- Speaker diarization runs in a child of its own (`speakers/process.py`), not in this one: a
  crash in its native code never takes the model down with it.
"""

from __future__ import annotations

import functools
import multiprocessing
import multiprocessing.connection
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from loguru import logger

from ..audio.vad import SileroModel, may_hold_speech
from .base import (
    Engine,
    EngineCrashedError,
    JobCancelledError,
    ShouldStop,
    TranscribeRequest,
    TranscribeResult,
    engine_errors,
    never_stop,
)
from .child import exit_text, stop_child, watch_parent
from .spec import EngineSpec
from .status import EngineStatus, WorkerStatus
from .wrapping import EngineWrapper, wait_or_cancel


class WorkerEngine(EngineWrapper):
    """Proxies an engine (`template`: built from `spec`, never loaded, here) to a child
    process that builds the same engine from the same picklable `spec`."""

    stepping = False  # the model runs in the child: whole calls over the pipe

    def __init__(
        self,
        template: Engine,
        spec: EngineSpec,
        *,
        hard_timeout: float,
        kill_grace: float = 10.0,
        log: tuple[str, bool] = ("INFO", False),
    ) -> None:
        super().__init__(template)  # languages, word times, batching: the template's
        self._spec = spec
        self._log = log  # the child's LOG_LEVEL and LOG_JSON
        self._hard_timeout = hard_timeout
        self._kill_grace = kill_grace
        self._process: Any = None
        self._conn: Any = None
        self._cancel: Any = None
        self._lock = threading.Lock()  # one call at a time over the pipe
        self._facts: dict[str, Any] = {}
        self.restarts = 0  # children that died or were killed
        self.state = "stopped"  # stopped | starting | ready | exited (died; restarted on use)

    # -- what the server shows: facts known without the child -----------------------------
    capacity = 1  # one call at a time over the pipe

    @property
    def device(self) -> str:
        return str(self._facts.get("device") or self.inner.device)

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.is_alive() else None

    def status(self) -> EngineStatus:
        facts = self._facts
        worker = WorkerStatus(self.pid, self.state, self.restarts)
        return EngineStatus(
            self.name,
            self.model_id,
            self.device,
            facts.get("dtype"),
            facts.get("attention"),
            worker=worker,
        )

    # -- lifecycle ------------------------------------------------------------------------
    def load(self) -> None:
        with self._lock:
            self._start()

    def unload(self) -> None:
        with self._lock:
            self._stop()

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        self._cancel = context.Event()
        self.state = "starting"
        process = context.Process(
            target=child_main,
            args=(child, self._cancel, self._spec, self._log, os.getpid()),
            name="qwen3-asr-worker",
            daemon=True,
        )
        process.start()
        child.close()
        self._process, self._conn = process, parent
        threading.Thread(
            target=self._watch, args=(process,), name="worker-watch", daemon=True
        ).start()
        try:
            reply = self._call(("load",), [], never_stop, deadline=None)
        except BaseException:
            self._stop()
            raise
        self._facts = reply
        self.state = "ready"
        logger.info("inference worker {} ready ({})", process.pid, reply)

    def _stop(self) -> None:
        process, conn = self._process, self._conn
        self._process = self._conn = None
        self._facts = {}
        self.state = "stopped"
        if process is not None:
            stop_child(process, conn)

    def _watch(self, process: Any) -> None:
        """Notice the child's exit when it happens, not at the next call. A call in flight
        notices it first (it holds the lock); a child that was stopped or replaced is no
        longer `self._process`."""
        multiprocessing.connection.wait([process.sentinel])
        with self._lock:
            if self._process is process:
                process.join(1)
                self._died(process)

    # -- calls ----------------------------------------------------------------------------
    def transcribe(
        self, request: TranscribeRequest, should_stop: ShouldStop = never_stop
    ) -> TranscribeResult:
        return self.transcribe_batch([request], should_stop)[0]

    def transcribe_batch(
        self, requests: list[TranscribeRequest], should_stop: ShouldStop = never_stop
    ) -> list[TranscribeResult]:
        with self._lock:
            self._alive()
            if should_stop():  # every caller left (e.g. during that start): nothing to send
                raise JobCancelledError()
            metas = [{k: v for k, v in vars(r).items() if k != "audio"} for r in requests]
            audios = [np.ascontiguousarray(r.audio, dtype=np.float32) for r in requests]
            results: list[TranscribeResult] = self._call(
                ("transcribe", metas), audios, should_stop, time.monotonic() + self._hard_timeout
            )
            return results

    def speech_probs(self, samples: np.ndarray) -> np.ndarray:
        """Voice detection's speech probability per 32 ms frame of `samples`, from the
        child's own voice detection (`wrapping.speech_prober`)."""
        with self._lock:
            self._alive()
            audio = np.ascontiguousarray(samples, dtype=np.float32)
            deadline = time.monotonic() + self._hard_timeout
            probs: np.ndarray = self._call(("probs",), [audio], never_stop, deadline)
            return probs

    def _alive(self) -> None:
        """A running child (the lock held): a fresh one if the last one died or was
        stopped."""
        if self._process is None or not self._process.is_alive():
            if self._process is not None:  # died between calls
                self._process.join(1)
                self._died(self._process)
            self._start()

    def _outcome(self, status: str, payload: list[Any]) -> Any:
        """The child's answer, or its error as the same class here."""
        if status == "ok":
            return payload[0]
        kind, text = payload
        known = engine_errors().get(kind)
        raise known(text) if known is not None else RuntimeError(f"{kind}: {text}")

    def _call(
        self,
        message: tuple[Any, ...],
        audios: list[np.ndarray],
        should_stop: ShouldStop,
        deadline: float | None,
    ) -> Any:
        process, conn, cancel = self._process, self._conn, self._cancel
        cancel.clear()

        def check(stop_asked: float | None) -> None:
            if not process.is_alive():
                raise EOFError
            now = time.monotonic()
            overdue = deadline is not None and now > deadline
            if overdue or (stop_asked is not None and now - stop_asked > self._kill_grace):
                self._kill(process, "overdue" if overdue else "did not stop when asked")
                raise JobCancelledError("the inference worker was killed")

        try:
            conn.send(message)
            for audio in audios:
                conn.send_bytes(audio.tobytes() if not audio.flags.c_contiguous else audio.data)
            # the child's engine polls `cancel` as its should_stop
            wait_or_cancel(conn.poll, should_stop, cancel.set, check)
            status, *payload = conn.recv()
        except (EOFError, OSError, BrokenPipeError) as exc:
            self._died(process)
            raise EngineCrashedError(
                f"The inference worker exited ({exit_text(process.exitcode)}); it is "
                "restarted on the next request."
            ) from exc
        return self._outcome(status, payload)

    def _kill(self, process: Any, why: str) -> None:
        logger.warning("killing inference worker {}: a job {}", process.pid, why)
        process.kill()
        process.join(5)
        self._died(process)

    def _died(self, process: Any) -> None:
        if self._process is process:
            self.restarts += 1
            process.join(2)  # reaped, so that its exit code is known (not "unknown exit")
            logger.error(
                "inference worker {} exited ({})", process.pid, exit_text(process.exitcode)
            )
            conn = self._conn
            self._process = self._conn = None
            self._facts = {}
            self.state = "exited"
            if conn is not None:
                conn.close()


# -- the child ------------------------------------------------------------------------------
def child_main(
    conn: Any,
    cancel: Any,
    spec: EngineSpec,
    log: tuple[str, bool],
    parent_pid: int,
) -> None:
    """The worker process: build and load the engine, then serve calls until told to exit
    or until the parent is gone."""
    from ..logging import setup_logging

    setup_logging(*log)
    threading.Thread(target=watch_parent, args=(parent_pid,), daemon=True).start()
    engine = spec.build()
    voice = functools.cache(SileroModel)  # the silence gate's voice detection, on first use
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "exit":
            return
        try:
            if message[0] == "load":
                engine.load()
                status = engine.status()
                facts = {
                    "device": status.device,
                    "dtype": status.dtype,
                    "attention": status.attention,
                }
                conn.send(("ok", facts))
                continue
            if message[0] == "probs":  # the pause search of a long upload, a call's turns
                audio = np.frombuffer(conn.recv_bytes(), dtype=np.float32)
                conn.send(("ok", voice().stream().probs(audio)))
                continue
            requests = []
            for fields in message[1]:  # everything but the audio, which follows as bytes
                audio = np.frombuffer(conn.recv_bytes(), dtype=np.float32)
                requests.append(TranscribeRequest(audio, **fields))
            conn.send(("ok", transcribe_heard(engine, requests, cancel.is_set, voice)))
        except Exception as exc:
            conn.send(("error", type(exc).__name__, str(exc)))


def transcribe_heard(
    engine: Engine,
    requests: list[TranscribeRequest],
    should_stop: ShouldStop,
    voice: Callable[[], SileroModel],
) -> list[TranscribeResult]:
    """`engine.transcribe_batch` for the requests the silence gate lets through: a quiet one
    in which voice detection hears no speech gets empty text without reaching the model
    (whisper and Qwen hear words in silence), as in the server's own gate."""
    heard = [not r.quiet or _may_hold_speech(voice, r.audio) for r in requests]
    kept = [r for r, h in zip(requests, heard, strict=True) if h]
    results = iter(engine.transcribe_batch(kept, should_stop) if kept else [])
    return [
        next(results) if h else TranscribeResult(text="", language=r.language)
        for r, h in zip(requests, heard, strict=True)
    ]


def _may_hold_speech(voice: Callable[[], SileroModel], audio: np.ndarray) -> bool:
    """The gate for one request; if voice detection itself fails, the request goes to the
    model (as if heard) instead of failing every request of the batch with it."""
    try:
        return may_hold_speech(voice(), audio)
    except Exception as exc:
        logger.warning(
            "silence gate failed ({}: {}); the model hears the segment", type(exc).__name__, exc
        )
        return True
