"""ENGINE=remote: each job goes over HTTP to one of several OpenAI-compatible transcription
backends (vLLM serving Qwen3-ASR, or more instances of this server).

The front keeps everything vLLM lacks (decoding any format, VAD segmentation, streaming
sessions, subtitles, translation, auth, limits, priorities); a backend only ever sees one
segment or utterance as 16 kHz mono 16-bit WAV with the fields vLLM's `TranscriptionRequest`
accepts (file, model, language, prompt, temperature, response_format=json).

HTTP runs on one asyncio loop in its own thread (httpx.AsyncClient): a scheduler thread hands
it a request and waits, polling `should_stop`, so a job whose callers have all gone closes
its connection (vLLM then aborts the generation) instead of running to its end. Each job in
flight takes a client of its own, with one keep-alive connection (`ClientShelf`): httpcore's
pool scans all of its connections for every request and every answer, which cost a front a
quarter of its CPU with a shared client and many streams.

The scheduler runs one thread per slot (all backends' REMOTE_MAX_INFLIGHT together), so
jobs leave the priority queue in order and no more are in flight than the backends take.
No backend ever gets more than its REMOTE_MAX_INFLIGHT: while some are down, the jobs beyond
the survivors' slots wait for one (`backend_waiting` in /health).
Each job goes to the backend with the fewest jobs in flight (round robin among equals). A
backend that refuses, times out or drops a connection is taken out of the rotation and
probed again after 1, 2, 4 ... s (up to REMOTE_PROBE_INTERVAL: the pool and its Prober are
`pool.py`); the job is retried once on another backend. One call to a backend has its
own timeout (REMOTE_CALL_TIMEOUT; by default half the job's REQUEST_TIMEOUT when there is
another backend to retry on), so a retry fits in the job's time. A backend that timed out on
a job comes back only when a short trial job
succeeds: a hung engine behind a `/v1/models` that still answers is not taken back by its
probe. With every backend down the job fails with BackendUnavailableError (503).

Auth: REMOTE_API_KEY goes to every backend as a bearer token. Credentials in a backend's URL
(`http://user:pass@host/v1`) go to that backend as HTTP Basic auth instead (one request has
one Authorization header) and are taken out of the URL the requests use; wherever the URL is
shown (/health, /metrics, logs, 503 messages) it is `config.redact_url`'s `user:***`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Coroutine, Hashable
from typing import Any, TypeVar

import httpx
import numpy as np
from loguru import logger

from ...audio.pcm import SAMPLE_RATE
from ...logging import REQUEST_ID
from ...text import parse_language
from ...transcript import Segment
from ..base import (
    EngineInputError,
    JobCancelledError,
    ShouldStop,
    TranscribeRequest,
    TranscribeResult,
    WholeCalls,
    never_stop,
)
from ..status import EngineStatus
from ..wrapping import wait_or_cancel
from .call import TRIAL_TIMEOUT, TRIAL_WAV, BackendFailedError, encode_wav, post_job
from .clients import ClientShelf
from .pool import Backend, BackendPool, Prober

T = TypeVar("T")


class RemoteEngine(WholeCalls):
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
        call_timeout: float | None = None,
    ) -> None:
        self.pool = BackendPool(urls, max_inflight, probe_interval)
        self._model = model
        self.model_id = model or "remote"
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # one call: with another backend to retry on, half the job's time, so the retry fits
        call = call_timeout or (request_timeout / 2 if len(urls) > 1 else request_timeout)
        self._timeout = httpx.Timeout(call, connect=connect_timeout)
        self._trial_timeout = min(call, TRIAL_TIMEOUT)
        self._probe_timeout = connect_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: httpx.AsyncClient | None = None  # the probes'
        self._shelf: ClientShelf | None = None  # the jobs'
        self._prober: Prober | None = None

    # -- what the server shows ---------------------------------------------------------
    @property
    def backends(self) -> list[Backend]:
        return self.pool.backends

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
    def capacity(self) -> int:
        """The backends' total: REMOTE_MAX_INFLIGHT each."""
        return self.pool.slots

    def status(self) -> EngineStatus:
        """Each backend's state, and the jobs waiting for a slot (every backend that is up
        is full, the others down)."""
        backends = tuple(self.pool.status())
        waiting = self.pool.waiting
        return EngineStatus(
            self.name,
            self.model_id,
            self.device,
            backends=backends,
            backend_waiting=waiting,
            backend_slot_wait=self.pool.slot_wait.snapshot(),
            backend_latency=tuple((b.label, b.latency.snapshot()) for b in self.backends),
        )

    # -- lifecycle ---------------------------------------------------------------------
    def load(self) -> None:
        """Start the HTTP loop, probe every backend once, keep probing on the loop.
        Never fails: a job finds out which backends are up (503 if none)."""
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="remote-http", daemon=True)
        self._thread.start()
        self._submit(self._open()).result()
        up = sum(b.state == "up" for b in self.backends)
        logger.info("remote backends: {} of {} up", up, len(self.backends))

    def unload(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(Exception):
            self._submit(self._close()).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        self._loop = self._thread = None

    def _submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if self._loop is None:
            coro.close()
            raise BackendFailedError("the remote engine is not loaded", down=False)
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def _open(self) -> None:
        limits = httpx.Limits(max_connections=2 * len(self.backends))
        self._client = httpx.AsyncClient(
            timeout=self._timeout, limits=limits, headers=self._headers
        )
        # A job's own client has its connection free: waiting for it means something is
        # wrong, so that wait is short (a timeout is a failed job, retried elsewhere).
        t = self._timeout
        timeout = httpx.Timeout(t.read, connect=t.connect, pool=self._probe_timeout)
        self._shelf = ClientShelf(timeout, self._headers)
        on_model = None if self._model else self._found_model
        self._prober = Prober(self.pool, self._client, self._probe_timeout, on_model, self._trial)
        await self._prober.start()

    async def _close(self) -> None:
        if self._prober is not None:
            await self._prober.stop()
        if self._client is not None:
            await self._client.aclose()
        if self._shelf is not None:
            await self._shelf.aclose()
        self._client = self._prober = self._shelf = None

    def _found_model(self, model: str) -> None:
        """A backend named its model (no REMOTE_MODEL set): the first one names this engine."""
        if self.model_id == "remote":
            self.model_id = model

    # -- jobs --------------------------------------------------------------------------
    def _form(self, backend: Backend, request: TranscribeRequest) -> dict[str, str]:
        """Only fields vLLM's TranscriptionRequest defines (tests/vllm_standin.py checks)."""
        form = {"response_format": "json"}
        model = self._model or backend.model
        if model:
            form["model"] = model
        if request.language:
            form["language"] = request.language
        # vLLM has no keywords field: they join the prompt, as Qwen's context takes them
        prompt = "\n".join(p for p in (request.prompt, ", ".join(request.keywords)) if p)
        if prompt:
            form["prompt"] = prompt
        if request.temperature is not None:
            form["temperature"] = f"{request.temperature:g}"
        return form

    async def _call(
        self, url: str, wav: bytes, form: dict[str, str], headers: dict[str, str]
    ) -> dict[str, str | None]:
        assert self._shelf is not None
        return await post_job(self._shelf, url, wav, form, headers)

    async def _trial(self, backend: Backend) -> str | None:
        """A short job of silence for a backend that timed out on one: None when it answers
        in time, else why not."""
        request = TranscribeRequest(np.zeros(SAMPLE_RATE // 2, np.float32))
        try:
            async with asyncio.timeout(self._trial_timeout):
                await self._call(
                    backend.url, TRIAL_WAV, self._form(backend, request), backend.headers
                )
        except TimeoutError:
            return f"a trial job timed out ({self._trial_timeout:g} s)"
        except (BackendFailedError, EngineInputError) as exc:
            return f"a trial job failed: {exc}"
        return None

    def _wait(self, future: concurrent.futures.Future[T], should_stop: ShouldStop) -> T:
        """The answer; if every caller goes first, cancel the request (its connection
        closes, so the backend can stop too)."""

        answered = threading.Event()  # (one per job: concurrent.futures.wait makes one a poll)
        future.add_done_callback(lambda _: answered.set())

        def ready(timeout: float) -> bool:
            return answered.wait(timeout)

        def give_up() -> None:
            future.cancel()
            raise JobCancelledError()

        wait_or_cancel(ready, should_stop, give_up)
        return future.result()

    def transcribe(
        self, request: TranscribeRequest, should_stop: ShouldStop = never_stop
    ) -> TranscribeResult:
        wav = encode_wav(request.audio)
        request_id = REQUEST_ID.get()  # one id in the front's and the backend's logs
        headers = {"X-Request-ID": request_id} if request_id != "-" else {}
        tried: list[Backend] = []
        failure = ""
        while len(tried) < 2:  # one retry, on another backend
            if should_stop():
                raise JobCancelledError()
            backend = self.pool.acquire(tried, should_stop)  # waits for a free slot
            if backend is None:
                break
            tried.append(backend)
            started = time.perf_counter()
            outcome = "cancelled"
            try:
                form = self._form(backend, request)
                post = self._call(backend.url, wav, form, {**headers, **backend.headers})
                answer = self._wait(self._submit(post), should_stop)
                outcome = "answered"
                return self._result(request, answer, time.perf_counter() - started)
            except BackendFailedError as exc:
                outcome, failure = "failed", f"{backend.label}: {exc}"
                if exc.down:
                    self.pool.mark_down(backend, str(exc), hung=exc.hung)
                logger.warning("remote job failed on {}: {}", backend.label, exc)
            except ValueError:
                outcome = "answered"  # the backend refused the input: it is working
                raise
            finally:
                self.pool.release(backend, outcome, time.perf_counter() - started)
        raise self.pool.unavailable(failure)

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

    long_form_batches = False  # a long file is shared by the backend slots instead

    def batch_key(self, request: TranscribeRequest) -> Hashable | None:
        return None  # concurrency comes from the scheduler's slots, one job per HTTP call

    def transcribe_batch(
        self, requests: list[TranscribeRequest], should_stop: ShouldStop = never_stop
    ) -> list[TranscribeResult]:
        return [self.transcribe(r, should_stop) for r in requests]
