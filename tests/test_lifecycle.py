"""ModelManager unit tests with a fake engine that counts loads and unloads."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from qwen3_asr_server.api.error_table import http_status
from qwen3_asr_server.engines.base import TranscribeRequest, TranscribeResult
from qwen3_asr_server.errors import ModelLoadError, UnavailableError
from qwen3_asr_server.models.hub_fetch import BackgroundDownload
from qwen3_asr_server.runtime.lifecycle import ModelManager


class FakeEngine:
    name = "fake"
    model_id = "fake-model"
    device = "cpu"
    languages = None

    def __init__(
        self, load_seconds: float = 0.0, failures: int = 0, unload_seconds: float = 0.0
    ) -> None:
        self.load_seconds = load_seconds
        self.unload_seconds = unload_seconds
        self.attempts = 0
        self.failures = failures
        self.loads = 0
        self.unloads = 0
        self.loaded = False
        self.unloaded_at: list[float] = []  # monotonic, when each unload began
        self.unload_gate: threading.Event | None = None  # an unload waits for it, when set
        self.lock = threading.Lock()

    def load(self) -> None:
        with self.lock:
            self.attempts += 1
        time.sleep(self.load_seconds)
        with self.lock:
            if self.failures > 0:
                self.failures -= 1
                raise ModelLoadError("no network: set MODEL_ID to a local directory")
            self.loads += 1
            self.loaded = True

    def unload(self) -> None:
        self.unloaded_at.append(time.monotonic())
        if self.unload_gate is not None:
            self.unload_gate.wait(30)
        time.sleep(self.unload_seconds)
        self.unloads += 1
        self.loaded = False

    def transcribe(self, request: TranscribeRequest, should_stop: Any = None) -> TranscribeResult:
        return TranscribeResult(text="", language=None)


async def until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait for `condition`, not for a guessed time."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the condition"
        await asyncio.sleep(0.005)


def watched(manager: ModelManager) -> list[float]:
    """The idle watchdog's checks, each as the idle time it saw: a test waits for checks made
    past the idle timeout, however late a busy machine runs them, instead of sleeping."""
    checks: list[float] = []
    check = manager.unload_if_idle

    async def counted() -> bool:
        checks.append(manager.idle_for())
        return await check()

    manager.unload_if_idle = counted  # type: ignore[method-assign]
    return checks


async def past_timeout(manager: ModelManager, checks: list[float], count: int = 3) -> None:
    """`count` watchdog checks made after the idle timeout had passed."""
    await until(lambda: sum(idle >= manager.idle_timeout for idle in checks) >= count)


async def test_single_flight_load_with_20_concurrent_users() -> None:
    engine = FakeEngine(load_seconds=0.2)
    manager = ModelManager(engine, idle_timeout=0)

    async def use() -> bool:
        async with manager.use() as e:
            return e.loaded  # type: ignore[attr-defined, no-any-return]

    results = await asyncio.gather(*[use() for _ in range(20)])
    assert all(results)
    assert engine.loads == 1
    assert manager.loads == 1


async def test_idle_unload_after_timeout() -> None:
    engine = FakeEngine()
    manager = ModelManager(engine, idle_timeout=0.2, check_interval=0.05)
    await manager.start()
    try:
        async with manager.use():
            released = time.monotonic()  # the last use ends after this
        assert manager.loaded
        await until(lambda: engine.unloads == 1)
        assert not manager.loaded
        assert engine.unloaded_at[0] - released >= 0.2  # not idle long enough before
        async with manager.use():  # loads again on demand
            pass
        assert engine.loads == 2
    finally:
        await manager.stop()


async def test_no_unload_while_in_use() -> None:
    engine = FakeEngine()
    manager = ModelManager(engine, idle_timeout=0.1, check_interval=0.02)
    await manager.start()
    try:
        checks = watched(manager)
        async with manager.use():
            await past_timeout(manager, checks)  # idle time counts from the load
            assert manager.loaded
            assert engine.unloads == 0
    finally:
        await manager.stop()


async def test_no_unload_while_the_worker_is_busy() -> None:
    """A caller may give up (timeout) while its job still runs on the inference thread."""
    engine = FakeEngine()
    busy = True
    manager = ModelManager(engine, idle_timeout=0.05, busy=lambda: busy, check_interval=0.02)
    checks = watched(manager)
    await manager.start()
    try:
        async with manager.use():
            pass
        await past_timeout(manager, checks)
        assert manager.loaded
        busy = False
        await until(lambda: not manager.loaded)
    finally:
        await manager.stop()


async def test_idle_timeout_zero_never_unloads() -> None:
    engine = FakeEngine()
    manager = ModelManager(engine, idle_timeout=0)
    await manager.start()
    async with manager.use():
        pass
    assert not await manager.unload_if_idle()
    assert manager.loaded
    await manager.stop()
    assert engine.unloads == 1  # stop() frees the model


async def test_failed_load_gives_503_then_recovers() -> None:
    engine = FakeEngine(failures=1)
    manager = ModelManager(engine, idle_timeout=0, retry_backoff=0.05)
    with pytest.raises(UnavailableError) as info:
        async with manager.use():
            pass
    assert http_status(info.value) == 503 and info.value.code == "model_unavailable"
    assert "MODEL_ID" in info.value.message
    assert manager.last_error is not None
    assert not manager.loaded
    assert manager.users == 0
    await until(lambda: manager.retry_in() == 0)  # past the backoff
    async with manager.use():
        pass
    assert manager.loaded
    assert manager.last_error is None


async def test_preload_loads_at_start() -> None:
    engine = FakeEngine()
    manager = ModelManager(engine, idle_timeout=0)
    await manager.start(preload=True)
    assert manager.loaded and engine.loads == 1
    await manager.stop()


async def test_cancelled_waiter_neither_cancels_the_load_nor_starts_a_second() -> None:
    """A caller cancelled mid-load (timeout, disconnect, superseded partial): the load goes
    on, the next caller joins it, and the model is loaded exactly once and known loaded."""
    engine = GatedEngine()
    manager = ModelManager(engine, idle_timeout=0.5, check_interval=0.05)
    await manager.start()
    try:

        async def use() -> None:
            async with manager.use():
                pass

        first = asyncio.create_task(use())
        await until(lambda: manager.state == "loading")
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert manager.state == "loading"
        second = asyncio.create_task(use())  # joins the same load
        await until(lambda: manager.users == 1)
        assert manager.state == "loading" and manager.load_attempts == 1
        engine.gate.set()
        await second
        assert engine.attempts == 1 and engine.loads == 1 and manager.loaded
        # The model is known loaded, so the idle watchdog gives it back.
        await until(lambda: engine.unloads == 1)
        assert not manager.loaded
    finally:
        engine.gate.set()
        await manager.stop()


async def test_all_waiters_cancelled_the_load_still_completes() -> None:
    engine = GatedEngine()
    manager = ModelManager(engine, idle_timeout=0)

    async def use() -> None:
        async with manager.use():
            pass

    tasks = [asyncio.create_task(use()) for _ in range(3)]
    await until(lambda: manager.state == "loading" and manager.users == 3)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert all(task.cancelled() for task in tasks)
    assert manager.state == "loading"  # the load goes on without them
    engine.gate.set()
    await until(lambda: manager.loaded)
    assert engine.loads == 1 and engine.attempts == 1
    await manager.stop()
    assert engine.unloads == 1


async def test_request_during_unload_waits_and_loads_again() -> None:
    engine = FakeEngine()
    engine.unload_gate = threading.Event()
    manager = ModelManager(engine, idle_timeout=0.05, check_interval=0.02)
    await manager.start()
    try:
        async with manager.use():
            pass
        await until(lambda: manager.state == "unloading")  # the watchdog began the unload

        async def request() -> None:
            async with manager.use() as used:
                assert used.loaded  # type: ignore[attr-defined]  # never a torn-down engine
                assert manager.loaded

        waiting = asyncio.create_task(request())
        await until(lambda: manager.users == 1)
        assert manager.state == "unloading" and not waiting.done()  # it waits for the unload
        engine.unload_gate.set()
        await waiting
        assert engine.unloads == 1 and engine.loads == 2
    finally:
        engine.unload_gate.set()
        await manager.stop()


async def test_failed_load_answers_every_waiter_once_then_backs_off() -> None:
    engine = FakeEngine(load_seconds=0.1, failures=5)
    manager = ModelManager(engine, idle_timeout=0, retry_backoff=1.0, max_backoff=4.0)

    async def use() -> BaseException | None:
        try:
            async with manager.use():
                return None
        except UnavailableError as exc:
            return exc

    errors = await asyncio.gather(*[use() for _ in range(10)])
    assert engine.attempts == 1  # one load for all ten waiters
    assert all(isinstance(e, UnavailableError) for e in errors)
    # Within the backoff: refused at once, no new attempt, and told when to come back.
    again = await use()
    assert isinstance(again, UnavailableError)
    assert engine.attempts == 1
    assert again.retry_after == 1
    assert "try to load the model again" in again.message
    await until(lambda: manager.retry_in() == 0)
    await use()
    assert engine.attempts == 2  # retried after the backoff, which now doubles
    assert 1.0 < manager.retry_in() <= 2.0


async def test_the_backoff_stays_capped_after_very_many_failures() -> None:
    engine = FakeEngine(failures=1)
    manager = ModelManager(engine, idle_timeout=0, retry_backoff=5.0, max_backoff=60.0)
    manager._failures = 5000  # a model that has stayed broken for days
    with pytest.raises(UnavailableError) as info:
        async with manager.use():
            pass
    assert info.value.retry_after == 60


class GatedEngine(FakeEngine):
    """A load that hangs (a stalled download, a child stuck in from_pretrained) until the
    test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def load(self) -> None:
        self.gate.wait(60)
        super().load()


async def test_a_hung_load_answers_each_waiter_503_after_its_timeout_and_goes_on() -> None:
    """Issue 29: a waiter waits at most `load_timeout` (REQUEST_TIMEOUT) for the load, then
    gets a 503 saying the model is still loading; the load itself is not cancelled."""
    engine = GatedEngine()
    manager = ModelManager(engine, idle_timeout=0, load_timeout=0.2)
    try:
        waiters = [asyncio.create_task(manager.use().__aenter__()) for _ in range(3)]
        errors = await asyncio.gather(*waiters, return_exceptions=True)
        for error in errors:
            assert isinstance(error, UnavailableError), error
            assert http_status(error) == 503 and error.code == "model_loading"
            assert error.retry_after is not None and error.retry_after >= 1
            assert "loading" in error.message and "fake-model" in error.message
        assert manager.users == 0  # every refused waiter let go of the model
        assert manager.state == "loading" and manager.load_attempts == 1
        with pytest.raises(UnavailableError, match="has been loading for"):
            async with manager.use():
                pass
        assert manager.load_attempts == 1  # joined the same load, did not start another
        engine.gate.set()
        deadline = time.monotonic() + 30
        while not manager.loaded and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        async with manager.use() as used:
            assert used.loaded  # type: ignore[attr-defined]
        assert engine.attempts == 1 and engine.loads == 1 and manager.loaded
    finally:
        engine.gate.set()
        await manager.stop()


# -- through a real server -----------------------------------------------------------------
def test_a_request_during_a_hung_load_gets_503_model_loading_then_is_served() -> None:
    import httpx

    import speech
    from engines import GatedLoad
    from helpers import whisper_settings
    from qwen3_asr_server.app import create_app
    from qwen3_asr_server.engines import create_engine
    from server import live_server

    settings = whisper_settings(request_timeout=5.0)  # the wait for the load, then the job
    engine = GatedLoad(create_engine(settings))
    data = speech.path("sentence_01.wav").read_bytes()

    def post() -> httpx.Response:
        files = {"file": ("a.wav", data)}
        return httpx.post(srv.url + "/v1/audio/transcriptions", files=files, timeout=60)

    with live_server(create_app(settings, engine=engine)) as srv:  # type: ignore[arg-type]
        try:
            r = post()
            assert r.status_code == 503, r.text
            error = r.json()["error"]
            assert error["code"] == "model_loading" and "has been loading for" in error["message"]
            assert int(r.headers["Retry-After"]) >= 1
            assert srv.get("/health").json()["model_state"] == "loading"
        finally:
            engine.gate.set()
        deadline = time.monotonic() + 60
        while not srv.get("/health").json()["model_loaded"] and time.monotonic() < deadline:
            time.sleep(0.1)
        r = post()
        assert r.status_code == 200 and "quick" in r.json()["text"].lower(), r.text


# -- the background download (issue 33) -----------------------------------------------------
class GatedDownload(BackgroundDownload):
    """A download whose transfer is a gate: no network, no files. It fails `failures` times
    first."""

    def __init__(self, failures: int = 0) -> None:
        super().__init__(["test-org/model"], retry_backoff=0.05, max_backoff=0.1)
        self.gate = threading.Event()
        self.failures_left = failures
        self.bytes_total = 1000

    def _fetch_all(self) -> None:
        self.bytes_done = 400
        if self.failures_left > 0:
            self.failures_left -= 1
            raise ConnectionError("network is unreachable")
        self.gate.wait(30)
        self.bytes_done = self.bytes_total

    def _poll(self) -> None:  # progress is set by the fake transfer
        pass


async def test_requests_during_a_download_get_503_at_once_and_preload_loads_after_it() -> None:
    engine = FakeEngine()
    download = GatedDownload()
    manager = ModelManager(engine, idle_timeout=0, download=download, load_timeout=30)
    await manager.start(preload=True)
    try:
        deadline = time.monotonic() + 30
        while download.bytes_done == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        started = time.monotonic()
        with pytest.raises(UnavailableError) as info:
            async with manager.use():
                pass
        # never waits on the download (it would wait for load_timeout, 30 s)
        assert time.monotonic() - started < 10
        assert info.value.code == "model_downloading" and http_status(info.value) == 503
        assert "40% done" in info.value.message and info.value.retry_after >= 1  # type: ignore[operator]
        assert engine.attempts == 0
        download.gate.set()
        await asyncio.wait_for(download.finished.wait(), 30)
        deadline = time.monotonic() + 30
        while not manager.loaded and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert manager.loaded and engine.loads == 1  # PRELOAD, right after the download
        assert download.status()["state"] == "done"
    finally:
        download.gate.set()
        await manager.stop()


async def test_a_failed_download_is_shown_and_retried_with_the_backoff() -> None:
    engine = FakeEngine()
    download = GatedDownload(failures=2)
    download.gate.set()
    manager = ModelManager(engine, idle_timeout=0, download=download)
    await manager.start()
    try:
        deadline = time.monotonic() + 30
        while download.failures == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        status = download.status()
        assert status["failures"] >= 1 and status["error"]
        await asyncio.wait_for(download.finished.wait(), 30)
        assert download.failures == 2 and download.done and download.error is None
        async with manager.use():
            pass
        assert engine.loads == 1
    finally:
        await manager.stop()
