"""The fast parts of the reliability suite (the long ones are bench/reliability.py):
a client that sends huge messages never stalls the others, and clients that burst audio and
vanish leave nothing behind."""

from __future__ import annotations

import json
import threading
import time

import httpx
import numpy as np
import pytest

import speech
from helpers import whisper_settings
from qwen3_asr_server.app import create_app
from server import live_server
from streaming_client import load, open_ws, pcm16

pytestmark = pytest.mark.slow


def test_health_stays_fast_while_a_client_sends_1mb_messages() -> None:
    audio = np.tile(load("long_2min.wav")[: 16000 * 30], 2)  # 60 s
    with live_server(create_app(whisper_settings(preload=True))) as srv:
        done = threading.Event()

        def sender() -> None:
            try:
                with open_ws(srv.url) as ws:
                    json.loads(ws.recv(timeout=10))
                    for i in range(0, len(audio), 500_000):  # 1 MB of PCM per message
                        ws.send(pcm16(audio[i : i + 500_000]))
                    ws.send(json.dumps({"action": "flush"}))
                    while not json.loads(ws.recv(timeout=60)).get("is_final"):
                        pass
            finally:
                done.set()

        thread = threading.Thread(target=sender)
        thread.start()
        latencies = []
        with httpx.Client(timeout=10) as client:
            while not done.is_set():
                started = time.perf_counter()
                assert client.get(srv.url + "/health").status_code == 200
                latencies.append(time.perf_counter() - started)
                time.sleep(0.01)
        thread.join()
        assert len(latencies) > 20
        # The goal is < 100 ms (bench/reliability.py measures it); the margin is for a
        # loaded CI machine. Before VAD moved off the event loop this was ~350 ms.
        assert max(latencies) < 0.25, max(latencies)


def test_bursts_then_disconnects_leave_nothing_behind() -> None:
    audio = load("long_2min.wav")
    with live_server(create_app(whisper_settings(preload=True))) as srv:

        def client(k: int) -> None:
            with open_ws(srv.url) as ws:
                for burst in range(3):
                    start = 16000 * 8 * (k * 3 + burst)
                    for i in range(start, start + 16000 * 8, 16000):
                        ws.send(pcm16(audio[i : i + 16000]))
                    time.sleep(0.1)

        threads = [threading.Thread(target=client, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        deadline = time.monotonic() + 60
        health = srv.get("/health").json()
        while time.monotonic() < deadline:
            health = srv.get("/health").json()
            if not health["streaming_sessions"] and not health["queue_depth"]:
                break
            time.sleep(0.05)
        assert health["streaming_sessions"] == 0 and health["queue_depth"] == 0
        started = time.perf_counter()
        response = httpx.post(
            srv.url + "/v1/audio/transcriptions",
            files={"file": ("a.wav", speech.path("sentence_03.wav").read_bytes())},
            timeout=60,
        )
        assert response.status_code == 200 and response.json()["text"]
        assert time.perf_counter() - started < 5
