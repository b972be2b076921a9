"""What streaming clients are answered, end to end (real uvicorn, the bundled whisper
model): a flush is answered after the finals still pending, and the finals of a client
that has left run at upload priority."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest

from helpers import whisper_settings
from qwen3_asr_server.app import create_app
from server import live_server
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
