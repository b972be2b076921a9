"""Streaming sessions are bounded: a session counts toward WS_MAX_SESSIONS until its client
leaves (then its queued finals are joined into a few), audio received before a disconnect
is transcribed, and a client that sends faster than finals are produced is slowed down,
not buffered."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from typing import Any

import pytest
from loguru import logger

from engines import Recording
from helpers import whisper_settings
from qwen3_asr_server.app import create_app
from qwen3_asr_server.engines import create_engine
from server import live_server
from streaming_client import load, open_ws, pcm16

pytestmark = pytest.mark.slow


def slow_app(delay: float, **settings: object):  # type: ignore[no-untyped-def]
    config = whisper_settings(**settings)
    engine = Recording(create_engine(config), delay=delay)
    return create_app(config, engine=engine), engine  # type: ignore[arg-type]


def sessions(srv) -> int:  # type: ignore[no-untyped-def]
    return int(srv.get("/health").json()["streaming_sessions"])


class GatedFinals(Recording):
    """The real whisper engine; finals wait until `gate` is set."""

    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        self.gate = threading.Event()
        self.final_waiting = threading.Event()

    def transcribe(self, request: Any, should_stop: Any = None) -> Any:
        if not request.partial:
            self.final_waiting.set()
            self.gate.wait(120)
        return super().transcribe(request, should_stop)

    def finals(self) -> list[float]:
        """Each final's audio, in seconds."""
        return [c for c, (partial, _) in zip(self.calls, self.kinds, strict=True) if not partial]


def wait_until(predicate: Any, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_client_that_left_gives_its_seat_back_and_its_queued_finals_are_joined() -> None:
    """Issue 49: a client that flushed every 100 ms and left ~85 finals queued held its seat
    for minutes (each final decoded alone, at upload priority). Its seat is free at once;
    the audio it sent is still transcribed, its queued finals joined into a few. As many
    such clients may finish so as there are seats: one more keeps its seat meanwhile.
    (43 flushes here: the 42 queued join into 2, more than one join as with 85.)"""
    settings = whisper_settings(preload=True, ws_max_sessions=1)
    engine = GatedFinals(create_engine(settings))
    app = create_app(settings, engine=engine)  # type: ignore[arg-type]
    messages: list[str] = []
    held = threading.Event()

    def sink(message: Any) -> None:
        messages.append(str(message))
        if "seat is held" in str(message):
            held.set()

    handler = logger.add(sink, level="INFO")
    chunk = pcm16(load("sentence_02.wav")[16000 : 16000 + 1536])  # 96 ms: 3 VAD frames
    item = (1536 + 9600) / 16000  # a flush's final: the audio and 600 ms of padding
    try:
        with live_server(app) as srv:
            registry = srv.ctx.sessions
            with open_ws(srv.url, use_server_vad="false") as ws:
                assert json.loads(ws.recv(timeout=30))["status"] == "connected"
                for _ in range(43):
                    ws.send(chunk)
                    ws.send('{"action": "flush"}')
                assert engine.final_waiting.wait(60)  # the first final runs; the rest queue
                # every flush committed (42 would be 29.2 s): they wait for their finals
                assert wait_until(lambda: registry.lag()[1] > 29.5), registry.lag()
            # the client left, its finals are still held by the gate: the seat is free
            assert wait_until(lambda: sessions(srv) == 0)
            assert not engine.finals() and registry.lag()[1] > 29.5  # (the first at the gate)
            with open_ws(srv.url, use_server_vad="false") as ws:
                assert json.loads(ws.recv(timeout=30))["status"] == "connected"
                ws.send(chunk)
                ws.send('{"action": "flush"}')
            # one client's finals already run without a seat (WS_MAX_SESSIONS=1): this one
            # keeps its seat until its final is done
            assert held.wait(60)
            assert sessions(srv) == 1
            engine.gate.set()
            # (~40 s of audio to decode: a minute or more on a busy 2-core machine)
            assert wait_until(lambda: sessions(srv) == 0 and registry.lag()[1] == 0.0, 600)
            finals = engine.finals()
            # the first client's: 1 running + 42 queued joined into 2 (25 s each at most);
            # nothing lost; the second client's one
            assert len(finals) == 1 + 2 + 1, finals
            assert abs(sum(finals) - 44 * item) < 0.01, finals
            assert max(finals) <= settings.ws_max_utterance_s
            assert any("42 finals joined into 2" in m for m in messages), messages
    finally:
        engine.gate.set()
        logger.remove(handler)


def test_a_client_that_left_while_held_back_gives_its_seat_back() -> None:
    """Review of issue 49 item 5: past WS_MAX_PENDING_S the server stops reading the client
    (back-pressure); a client that left then kept its seat for as long as its finals took
    (the receive loop waited for room and never saw the disconnect). It is seen at once: the
    seat is free while the finals are still held at the gate; nothing it sent is lost."""
    settings = whisper_settings(preload=True, ws_max_sessions=1, ws_max_pending_s=5)
    engine = GatedFinals(create_engine(settings))
    app = create_app(settings, engine=engine)  # type: ignore[arg-type]
    chunk = pcm16(load("sentence_02.wav")[16000 : 16000 + 1536])  # 96 ms: 3 VAD frames
    item = (1536 + 9600) / 16000  # a flush's final: the audio and 600 ms of padding
    try:
        with live_server(app) as srv:
            registry = srv.ctx.sessions
            with open_ws(srv.url, use_server_vad="false") as ws:
                assert json.loads(ws.recv(timeout=30))["status"] == "connected"
                for _ in range(8):  # 8 x 0.696 s: past the 5 s bound
                    ws.send(chunk)
                    ws.send('{"action": "flush"}')
                ws.send(chunk)  # its feed waits for room: the server stops reading
                assert engine.final_waiting.wait(60)
                session = next(iter(registry._sessions))
                assert wait_until(
                    lambda: registry.lag()[1] > 5.0 and not session._finals.room.is_set()
                ), registry.lag()
                assert wait_until(lambda: session.lag > 0)  # the last chunk waits for room
            # the client left; its finals are still held at the gate: the seat is free
            assert wait_until(lambda: sessions(srv) == 0, 30), "the seat is still held"
            assert not engine.finals()
            engine.gate.set()
            assert wait_until(lambda: not registry._gone and registry.lag()[1] == 0.0, 300)
            finals = engine.finals()
            # the first at the gate, then the 7 queued and the last chunk's joined into one
            assert len(finals) == 2, finals
            assert abs(sum(finals) - 9 * item) < 0.01, finals
    finally:
        engine.gate.set()


def test_a_fast_sender_is_held_back_to_the_pending_bound() -> None:
    """30 s of audio sent at once with finals that take 1 s each: the server stops reading
    while more than WS_MAX_PENDING_S waits for finals, then takes the rest; nothing lost."""
    app, _ = slow_app(1.0, ws_max_pending_s=10, ws_max_utterance_s=5)
    audio = load("long_2min.wav")[: 16000 * 30]  # twice the bound and one utterance past it
    with live_server(app) as srv:
        with open_ws(srv.url, use_server_vad="false") as ws:
            assert json.loads(ws.recv(timeout=10))["status"] == "connected"
            pending: list[float] = []
            for i in range(0, len(audio), 16000):
                ws.send(pcm16(audio[i : i + 16000]))
                session = next(iter(srv.ctx.sessions._sessions))
                pending.append(session.pending_seconds)
            ws.send(json.dumps({"action": "flush"}))
            finals = 0
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and srv.ctx.sessions._sessions:
                session = next(iter(srv.ctx.sessions._sessions))
                if finals and session.pending_seconds == 0 and session.turns.utterance is None:
                    break
                try:
                    message = json.loads(ws.recv(timeout=5))
                except TimeoutError:
                    continue
                finals += bool(message.get("is_final"))
        assert max(pending) <= 10 + 5 + 1  # the bound, one utterance past it, one message
        assert finals >= 6  # 30 s in utterances of at most 5 s: every one got its final


@pytest.mark.slow
def test_a_cancellation_before_the_receive_loop_gives_the_seat_back(monkeypatch: Any) -> None:
    """Issue 58 §4: between taking its seat and its receive loop, /ws/transcribe had no
    cover: a cancellation there (a server shutting down, a task cancelled) kept the seat
    for good. With WS_MAX_SESSIONS=1 the next stream is served."""
    from qwen3_asr_server.api.seed import transcribe as ws_transcribe

    real = ws_transcribe.PcmIngest
    calls = []

    def cancelled_once(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        if len(calls) == 1:
            raise asyncio.CancelledError
        return real(*args, **kwargs)

    monkeypatch.setattr(ws_transcribe, "PcmIngest", cancelled_once)
    with live_server(create_app(whisper_settings(ws_max_sessions=1))) as srv:
        with open_ws(srv.url) as ws, contextlib.suppress(Exception):
            ws.recv(timeout=30)  # the connection ends without a word
        assert wait_until(lambda: sessions(srv) == 0, 30), "the seat is still held"
        with open_ws(srv.url) as ws:
            assert json.loads(ws.recv(timeout=30))["status"] == "connected"
