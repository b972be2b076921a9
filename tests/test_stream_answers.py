"""What streaming clients are answered, end to end (real uvicorn, the bundled whisper
model): a flush is answered after the finals still pending, and the finals of a client
that has left run at upload priority."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import numpy as np
import pytest

from engines import Recording
from helpers import whisper_settings
from qwen3_asr_server.app import create_app
from qwen3_asr_server.engines import create_engine
from server import LiveServer, live_server
from streaming_client import Collector, load, open_ws, stream

pytestmark = pytest.mark.slow


def test_a_flush_is_answered_after_the_pending_final_not_before_it() -> None:
    """Voice detection closes the utterance, its final is still running, the client sends
    flush and takes the next final as the answer. That final must be the utterance's text;
    it was an empty final sent at once, ahead of the real one."""
    with live_server(create_app(whisper_settings(preload=True))) as srv:
        audio = np.concatenate([load("sentence_01.wav"), np.zeros(16000, np.float32)])
        with open_ws(srv.url) as ws:
            got = Collector(ws)
            stream(ws, audio, speed=8)
            ws.send('{"action": "flush"}')
            assert got.wait_for(lambda c: c.finals(), 120)
            # answered after anything the flush sent: a stray empty final arrives before it
            ws.send('{"action": "reset"}')
            assert got.wait_for(
                lambda c: any(m.get("status") == "buffer_reset" for _, m in c.messages), 60
            )
        finals = got.finals()
    assert "quick" in finals[0].lower(), finals
    # an empty final may follow only if the real one was already sent when the flush came
    assert finals[1:] in ([], [""]), finals


def batch_audio_seconds(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("asr_audio_seconds_total") and 'priority="batch"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_finals_of_a_client_that_left_run_at_upload_priority() -> None:
    """No one waits for the finals of a client that disconnected: they drop to batch
    priority, so an upload is not stuck behind them."""
    with live_server(create_app(whisper_settings(preload=True))) as srv:
        assert batch_audio_seconds(srv.url) == 0.0
        with open_ws(srv.url, use_server_vad="false") as ws:
            stream(ws, load("three_sentences.wav"), speed=50)
        # the utterance open at the disconnect is finalised after the client left
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and batch_audio_seconds(srv.url) == 0.0:
            time.sleep(0.1)
        assert batch_audio_seconds(srv.url) > 3.0


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


def test_shutdown_stops_accepting_before_it_drains_the_sessions() -> None:
    """While the open sessions get their finals at shutdown, no new connection is
    accepted (it was: and its finals went to a socket already closed)."""
    settings = whisper_settings(preload=True)
    engine = GatedFinals(create_engine(settings))
    srv = LiveServer(create_app(settings, engine=engine))  # type: ignore[arg-type]
    srv.start()
    try:
        ws = open_ws(srv.url, use_server_vad="false")
        got = Collector(ws)
        assert got.wait_for(lambda c: c.messages, 30)  # connected
        stream(ws, load("sentence_01.wav"), speed=8)
        srv.server.should_exit = True  # shut down with the utterance open
        assert engine.final_waiting.wait(60)  # the sessions are being finalized now
        with pytest.raises(OSError):
            open_ws(srv.url).close()
        engine.gate.set()
        assert got.closed.wait(60)
        assert "quick" in got.finals()[0].lower()
    finally:
        engine.gate.set()
        srv.stop()
