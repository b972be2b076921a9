"""ModelManager unit tests with a fake engine that counts loads and unloads."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from qwen3_asr_server.engines.base import ModelLoadError, TranscribeRequest, TranscribeResult
from qwen3_asr_server.errors import ModelUnavailableError
from qwen3_asr_server.lifecycle import ModelManager


class FakeEngine:
    name = "fake"
    model_id = "fake-model"
    device = "cpu"
    languages = None

    def __init__(self, load_seconds: float = 0.0, failures: int = 0) -> None:
        self.load_seconds = load_seconds
        self.failures = failures
        self.loads = 0
        self.unloads = 0
        self.loaded = False
        self.lock = threading.Lock()

    def load(self) -> None:
        time.sleep(self.load_seconds)
        with self.lock:
            if self.failures > 0:
                self.failures -= 1
                raise ModelLoadError("no network: set MODEL_ID to a local directory")
            self.loads += 1
            self.loaded = True

    def unload(self) -> None:
        self.unloads += 1
        self.loaded = False

    def transcribe(self, request: TranscribeRequest) -> TranscribeResult:
        return TranscribeResult(text="", language=None)


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
            pass
        assert manager.loaded
        await asyncio.sleep(0.05)
        assert manager.loaded  # not idle long enough yet
        await asyncio.sleep(0.4)
        assert not manager.loaded
        assert engine.unloads == 1
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
        async with manager.use():
            await asyncio.sleep(0.4)  # well past the idle timeout
            assert manager.loaded
            assert engine.unloads == 0
    finally:
        await manager.stop()


async def test_no_unload_while_the_worker_is_busy() -> None:
    """A caller may give up (timeout) while its job still runs on the inference thread."""
    engine = FakeEngine()
    busy = True
    manager = ModelManager(engine, idle_timeout=0.05, busy=lambda: busy, check_interval=0.02)
    await manager.start()
    try:
        async with manager.use():
            pass
        await asyncio.sleep(0.2)
        assert manager.loaded
        busy = False
        await asyncio.sleep(0.2)
        assert not manager.loaded
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
    manager = ModelManager(engine, idle_timeout=0)
    with pytest.raises(ModelUnavailableError) as info:
        async with manager.use():
            pass
    assert info.value.status == 503
    assert "MODEL_ID" in info.value.message
    assert manager.last_error is not None
    assert not manager.loaded
    assert manager.users == 0
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
