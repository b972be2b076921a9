"""Admission, not refusal halfway: MAX_QUEUE admits new work once; admitted uploads and
streaming finals are never refused for queue depth; a final that fails says why, with a
retryable status, in both streaming protocols. Real uvicorn, the bundled whisper model,
the openai SDK."""

from __future__ import annotations

import base64
import threading
import time
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import soxr
from openai.types.realtime import ConversationItemInputAudioTranscriptionFailedEvent

import speech
from helpers import whisper_settings
from proc import ServerProcess
from qwen3_asr_server.app import create_app
from server import free_port, live_server
from streaming_client import Collector, load, open_ws, pcm16, stream

pytestmark = pytest.mark.slow


def wait_until(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_admitted_uploads_and_a_final_are_never_refused_for_queue_depth() -> None:
    """The issue's reproduction: MAX_QUEUE=12, concurrent 2-minute uploads (each keeps up to
    MAX_BATCH_SIZE+1 segments in flight: three, up to 15, fill the queue as the issue's four
    did) and a /ws/transcribe flush while they run.
    Before: two admitted uploads failed midway with 503 queue_full and the final came back
    as TRANSCRIPTION_FAILED 500. Now: every upload is answered 200 or refused at admission
    (before any of its work ran), and the final has text."""
    with open(speech.path("long_2min.wav"), "rb") as f:
        data = f.read()
    settings = whisper_settings(max_queue=12, max_batch_size=4, preload=True)
    with live_server(create_app(settings)) as srv:
        results: list[tuple[int, float, dict[str, Any]]] = []

        def upload() -> None:
            started = time.monotonic()
            r = httpx.post(
                srv.url + "/v1/audio/transcriptions",
                files={"file": ("long.wav", data)},
                data={"model": "whisper-1"},
                timeout=600,
            )
            results.append((r.status_code, time.monotonic() - started, r.json()))

        uploads = [threading.Thread(target=upload) for _ in range(3)]
        for t in uploads:
            t.start()
        # the flush goes in while the uploads' segments fill the queue (without that
        # contention the test proves nothing: it fails)
        filled = wait_until(lambda: srv.ctx.scheduler.depth >= 8, 120)
        assert filled, ("the uploads never filled the queue", results)
        with open_ws(srv.url, use_server_vad="false") as ws:
            got = Collector(ws)
            stream(ws, load("sentence_01.wav"), speed=8)
            contention = (srv.ctx.scheduler.depth, any_alive(uploads))
            ws.send('{"action": "flush"}')
            assert got.wait_for(lambda c: c.finals() or errors(c), 300)
        for t in uploads:
            t.join(600)
        # each admitted upload stopped counting as arriving once its first segment queued
        assert srv.ctx.scheduler.arriving == 0
    # the final went in behind upload work (16 jobs waiting were seen)
    assert contention[1] and contention[0] >= 4, contention
    assert not errors(got), errors(got)
    assert "quick" in got.finals()[0].lower()
    statuses = sorted(status for status, _, _ in results)
    assert len(results) == 3 and statuses[0] == 200, results
    for status, seconds, body in results:
        if status == 200:
            assert len(body["text"].split()) > 100  # the whole 2-minute file, nothing lost
        else:  # refused at admission: at once, before decoding, never halfway
            assert status == 503 and body["error"]["code"] == "queue_full", body
            assert seconds < 10.0, seconds  # ~0.1 s measured; the others take 10+ s


def any_alive(threads: list[threading.Thread]) -> bool:
    return any(t.is_alive() for t in threads)


def errors(c: Collector) -> list[dict[str, Any]]:
    return [m for _, m in c.messages if "code" in m]


def test_a_failed_final_is_a_retryable_503_in_both_protocols() -> None:
    """A final that cannot be transcribed (every backend down) is an error the client can
    act on: the seed protocol's retryable code with statusCode 503 (it was a hard-coded
    500), and Realtime's conversation.item.input_audio_transcription.failed."""
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    front = ServerProcess(
        {
            "ENGINE": "remote",
            "REMOTE_BACKENDS": url,
            "REMOTE_PROBE_INTERVAL": "1",
            "IDLE_TIMEOUT": "0",
            "LOG_LEVEL": "INFO",
        }
    )
    try:
        front.wait_healthy(60)
        audio = load("sentence_01.wav")
        with open_ws(front.url, use_server_vad="false") as ws:
            got = Collector(ws)
            stream(ws, audio, speed=8)
            ws.send('{"action": "flush"}')
            assert got.wait_for(lambda c: errors(c) and c.finals(), 120)
        error = errors(got)[0]
        assert error["statusCode"] == 503, error
        assert error["code"] == "TRANSCRIPTION_UNAVAILABLE" and error["retryable"] is True
        assert url in error["message"] and int(error["retry_after"]) >= 1
        # an error is never a transcript; the flush is still answered, after the error
        assert got.finals() == [""]
        kinds = [
            "error" if "code" in m else "final"
            for _, m in got.messages
            if "code" in m or m.get("is_final")
        ]
        assert kinds == ["error", "final"]

        sdk = openai.OpenAI(base_url=front.url + "/v1", api_key="x", max_retries=0)
        with sdk.realtime.connect(extra_query={"intent": "transcription"}) as conn:
            assert conn.recv().type == "session.created"
            conn.send({"type": "transcription_session.update", "session": {"turn_detection": None}})
            assert conn.recv().type == "transcription_session.updated"
            audio24k = soxr.resample(audio, 16000, 24000).astype(np.float32)
            chunk = base64.b64encode(pcm16(audio24k)).decode()
            conn.input_audio_buffer.append(audio=chunk)
            conn.input_audio_buffer.commit()
            failed = None
            for _ in range(50):
                event = conn.recv()
                if event.type == "conversation.item.input_audio_transcription.failed":
                    failed = event
                    break
        assert failed is not None
        checked = ConversationItemInputAudioTranscriptionFailedEvent.model_validate(
            failed.model_dump()
        )
        assert checked.error.code == "backends_unavailable"
        assert checked.error.message and url in checked.error.message
    finally:
        front.stop()
