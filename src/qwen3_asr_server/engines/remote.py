"""ENGINE=remote: each job goes over HTTP to one of several OpenAI-compatible transcription
backends (vLLM serving Qwen3-ASR, or more instances of this server).

The front keeps everything vLLM lacks (decoding any format, VAD segmentation, streaming
sessions, subtitles, translation, auth, limits, priorities); a backend only ever sees one
segment or utterance as 16 kHz mono 16-bit WAV with the fields vLLM's `TranscriptionRequest`
accepts (file, model, language, prompt, temperature, response_format=json).

The scheduler runs one thread per slot (all backends' REMOTE_MAX_INFLIGHT together), so
jobs leave the priority queue in order and no more are in flight than the backends take.
Each job goes to the backend with the fewest jobs in flight (round robin among equals). A
backend that refuses, times out or drops a connection is taken out of the rotation and
probed again after 1, 2, 4 ... s (up to REMOTE_PROBE_INTERVAL); the job is retried once on
another backend. With every backend down the job fails with BackendUnavailableError (503).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import threading
import time
import wave
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
from loguru import logger

from ..logging import REQUEST_ID
from ..text import parse_language
from .base import (
    BackendUnavailableError,
    JobCancelledError,
    Segment,
    ShouldStop,
    TranscribeRequest,
    TranscribeResult,
    never_stop,
)

SAMPLE_RATE = 16000
CLIENT_ERRORS = {400, 413, 415, 422}  # the input's fault: every backend would refuse it
BUSY = {429, 502, 503, 504}  # try another backend, but this one is not down


class BackendFailedError(Exception):
    """This backend gave no answer for the job; another backend may."""

    def __init__(self, message: str, down: bool) -> None:
        super().__init__(message)
        self.down = down


@dataclass
class Backend:
    url: str  # base URL ending in /v1
    max_inflight: int
    state: str = "unknown"  # unknown | up | down
    model: str | None = None
    inflight: int = 0
    requests: int = 0  # jobs answered
    errors: int = 0  # jobs this backend failed
    seconds: float = 0.0  # total time of answered jobs
    last_error: str | None = None
    failures: int = 0  # consecutive failed probes or jobs
    next_probe: float = 0.0  # monotonic
    picked: int = 0  # when it was last chosen (round robin among equals)

    def status(self, now: float) -> dict[str, Any]:
        return {
            "url": self.url,
            "state": self.state,
            "model": self.model,
            "inflight": self.inflight,
            "max_inflight": self.max_inflight,
            "requests": self.requests,
            "errors": self.errors,
            "seconds": round(self.seconds, 3),
            "latency_ms_avg": round(1000 * self.seconds / self.requests, 1)
            if self.requests
            else None,
            "last_error": self.last_error,
            "probe_in_s": round(max(0.0, self.next_probe - now), 1)
            if self.state == "down"
            else None,
        }


def encode_wav(samples: np.ndarray) -> bytes:
    """Mono float32 at 16 kHz -> 16-bit PCM WAV (what every backend decodes)."""
    # x 32768 and rounding: PCM that arrived as 16-bit (nearly all of it) passes unchanged.
    pcm = np.clip(np.rint(samples * 32768.0), -32768, 32767).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(pcm.tobytes())
    return out.getvalue()


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
        error = body.get("error", body) if isinstance(body, dict) else body
        text = error.get("message") if isinstance(error, dict) else None
        return str(text or body)[:300]
    except ValueError:
        return response.text[:300]


class RemoteEngine:
    name = "remote"

    def __init__(
        self,
        urls: list[str],
        *,
        model: str | None = None,
        api_key: str | None = None,
        max_inflight: int = 4,
        request_timeout: float = 300.0,
        connect_timeout: float = 2.0,
        probe_interval: float = 5.0,
    ) -> None:
        self.backends = [Backend(url, max_inflight) for url in urls]
        self._model = model
        self.model_id = model or "remote"
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = httpx.Timeout(request_timeout, connect=connect_timeout)
        self._probe_timeout = connect_timeout
        self._probe_interval = probe_interval
        self._lock = threading.Lock()
        self._picks = itertools.count(1)
        self._client: httpx.Client | None = None
        self._stop = threading.Event()
        self._prober: threading.Thread | None = None

    # -- what the server shows ---------------------------------------------------------
    @property
    def device(self) -> str:
        return "remote"

    @property
    def languages(self) -> frozenset[str] | None:
        return None  # each backend checks the language itself (a 400 comes back as a 400)

    @property
    def word_timestamps(self) -> str:
        return "estimate"  # backends answer text only: words are spread over the segment

    @property
    def slots(self) -> int:
        return sum(b.max_inflight for b in self.backends)

    def status(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        with self._lock:
            return [b.status(now) for b in self.backends]

    # -- lifecycle ---------------------------------------------------------------------
    def load(self) -> None:
        """Open the connection pool, probe every backend once, keep probing in a thread.
        Never fails: a job finds out which backends are up (503 if none)."""
        limits = httpx.Limits(max_connections=self.slots + 2 * len(self.backends))
        self._client = httpx.Client(timeout=self._timeout, limits=limits, headers=self._headers)
        probes = [threading.Thread(target=self._probe, args=(b,)) for b in self.backends]
        for t in probes:
            t.start()
        for t in probes:
            t.join()
        up = sum(b.state == "up" for b in self.backends)
        logger.info("remote backends: {} of {} up", up, len(self.backends))
        self._stop.clear()
        self._prober = threading.Thread(target=self._probe_loop, name="remote-probe", daemon=True)
        self._prober.start()

    def unload(self) -> None:
        self._stop.set()
        if self._prober is not None:
            self._prober.join(self._probe_timeout + 1)
            self._prober = None
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- health ------------------------------------------------------------------------
    def _probe_loop(self) -> None:
        while not self._stop.wait(0.2):
            now = time.monotonic()
            for backend in self.backends:
                if backend.next_probe <= now and not self._stop.is_set():
                    self._probe(backend)

    def _probe(self, backend: Backend) -> None:
        """GET /v1/models (or /health beside it): any answer but an auth error means up."""
        client = self._client
        if client is None:
            return
        try:
            r = client.get(f"{backend.url}/models", timeout=self._probe_timeout)
            if r.status_code == 404:
                root = backend.url.removesuffix("/v1")
                r = client.get(f"{root}/health", timeout=self._probe_timeout)
        except httpx.HTTPError as exc:
            self._mark_down(backend, f"unreachable: {type(exc).__name__}: {exc}")
            return
        if r.status_code in (401, 403):
            self._mark_down(backend, f"HTTP {r.status_code}: check REMOTE_API_KEY")
            return
        if r.status_code >= 500:
            self._mark_down(backend, f"HTTP {r.status_code}: {_message(r)}")
            return
        model = None
        if r.status_code == 200 and not self._model:
            try:
                model = str(r.json()["data"][0]["id"])
            except (ValueError, KeyError, IndexError, TypeError):
                model = None
        with self._lock:
            if backend.state != "up":
                logger.info("remote backend {} is up", backend.url)
            backend.state, backend.failures, backend.last_error = "up", 0, None
            backend.next_probe = time.monotonic() + self._probe_interval
            if model:
                backend.model = model
                if self.model_id == "remote":
                    self.model_id = model

    def _mark_down(self, backend: Backend, reason: str) -> None:
        with self._lock:
            if backend.state != "down":
                logger.warning("remote backend {} is down: {}", backend.url, reason)
            backend.state, backend.last_error = "down", reason
            backend.failures += 1
            delay = min(2.0 ** (backend.failures - 1), self._probe_interval)
            backend.next_probe = time.monotonic() + delay

    # -- jobs --------------------------------------------------------------------------
    def _acquire(self, exclude: list[Backend]) -> Backend | None:
        """The backend with the fewest jobs in flight, not down and not tried yet."""
        with self._lock:
            ready = [b for b in self.backends if b.state != "down" and b not in exclude]
            if not ready:
                return None
            chosen = min(ready, key=lambda b: (b.inflight / b.max_inflight, b.picked))
            chosen.inflight += 1
            chosen.picked = next(self._picks)
            return chosen

    def _release(self, backend: Backend, seconds: float | None) -> None:
        with self._lock:
            backend.inflight -= 1
            if seconds is None:
                backend.errors += 1
            else:
                backend.requests += 1
                backend.seconds += seconds

    def _form(self, backend: Backend, request: TranscribeRequest) -> dict[str, str]:
        form = {"response_format": "json"}
        model = self._model or backend.model
        if model:
            form["model"] = model
        if request.language:
            form["language"] = request.language
        if request.prompt:
            form["prompt"] = request.prompt
        if request.temperature is not None:
            form["temperature"] = f"{request.temperature:g}"
        return form

    @staticmethod
    def _trace() -> dict[str, str]:
        """The caller's request id, so one id is in the logs of the front and the backend."""
        request_id = REQUEST_ID.get()
        return {"X-Request-ID": request_id} if request_id != "-" else {}

    def _post(self, backend: Backend, wav: bytes, request: TranscribeRequest) -> dict[str, Any]:
        client = self._client
        if client is None:
            raise BackendFailedError("the remote engine is not loaded", down=False)
        try:
            r = client.post(
                f"{backend.url}/audio/transcriptions",
                files={"file": ("audio.wav", wav, "audio/wav")},
                data=self._form(backend, request),
                headers=self._trace(),
            )
        except httpx.TimeoutException as exc:
            raise BackendFailedError(f"timed out ({type(exc).__name__})", down=True) from exc
        except httpx.HTTPError as exc:
            raise BackendFailedError(f"{type(exc).__name__}: {exc}", down=True) from exc
        if r.status_code in CLIENT_ERRORS:
            raise ValueError(f"The backend refused the request: {_message(r)}")
        if r.status_code != 200:
            down = r.status_code not in BUSY and r.status_code != 500
            raise BackendFailedError(f"HTTP {r.status_code}: {_message(r)}", down=down)
        try:
            body = r.json()
            return {"text": str(body["text"]), "language": body.get("language")}
        except (ValueError, KeyError, TypeError) as exc:
            raise BackendFailedError(f"unexpected answer: {r.text[:200]!r}", down=True) from exc

    def transcribe(
        self, request: TranscribeRequest, should_stop: ShouldStop = never_stop
    ) -> TranscribeResult:
        wav = encode_wav(request.audio)
        tried: list[Backend] = []
        failure = ""
        while len(tried) < 2:  # one retry, on another backend
            if should_stop():
                raise JobCancelledError()
            backend = self._acquire(tried)
            if backend is None:
                break
            tried.append(backend)
            started = time.perf_counter()
            try:
                answer = self._post(backend, wav, request)
            except BackendFailedError as exc:
                self._release(backend, None)
                failure = f"{backend.url}: {exc}"
                if exc.down:
                    self._mark_down(backend, str(exc))
                logger.warning("remote job failed on {}: {}", backend.url, exc)
                continue
            except ValueError:
                self._release(backend, time.perf_counter() - started)
                raise
            seconds = time.perf_counter() - started
            self._release(backend, seconds)
            return self._result(request, answer, seconds)
        raise self._unavailable(failure)

    def _result(
        self, request: TranscribeRequest, answer: dict[str, Any], seconds: float
    ) -> TranscribeResult:
        text = answer["text"].strip()
        language = request.language
        if answer.get("language"):
            with contextlib.suppress(ValueError):
                language = parse_language(str(answer["language"])) or language
        duration = len(request.audio) / SAMPLE_RATE
        segments = [Segment(0.0, duration, text)] if text else []
        return TranscribeResult(text, language, segments, engine_seconds=seconds)

    def _unavailable(self, failure: str) -> BackendUnavailableError:
        now = time.monotonic()
        with self._lock:
            states = ", ".join(
                f"{b.url} ({b.state}{': ' + b.last_error if b.last_error else ''})"
                for b in self.backends
            )
            waits = [b.next_probe - now for b in self.backends if b.state == "down"]
        retry = max(1.0, min(waits, default=1.0))
        detail = f" Last failure: {failure}." if failure else ""
        return BackendUnavailableError(
            f"No remote backend could take the job. Backends: {states}.{detail}", retry
        )

    def batch_key(self, request: TranscribeRequest) -> Hashable | None:
        return None  # concurrency comes from the scheduler's slots, one job per HTTP call

    def transcribe_batch(
        self, requests: list[TranscribeRequest], should_stop: ShouldStop = never_stop
    ) -> list[TranscribeResult]:
        return [self.transcribe(r, should_stop) for r in requests]
