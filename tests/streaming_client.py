"""A small client for /ws/transcribe: stream a WAV at a chosen pace and collect messages."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import numpy as np
import soundfile as sf
from websockets.sync.client import ClientConnection, connect

import speech

CHUNK_S = 0.1


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


def load(name: str) -> np.ndarray:
    audio, _ = sf.read(speech.path(name), dtype="float32")
    return audio


class Collector:
    """Reads every message on a background thread, stamping arrival times."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.messages: list[tuple[float, dict[str, Any]]] = []
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for raw in self.ws:
                self.messages.append((time.perf_counter(), json.loads(raw)))
        except Exception:
            pass
        finally:
            self.closed.set()

    def finals(self) -> list[str]:
        return [m["text"] for _, m in self.messages if m.get("is_final")]

    def partials(self) -> list[dict[str, Any]]:
        return [m for _, m in self.messages if m.get("is_partial")]

    def wait_for(self, predicate: Any, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.02)
        return False


def open_ws(base_url: str, **query: str) -> ClientConnection:
    url = base_url.replace("http://", "ws://") + "/ws/transcribe"
    if query:
        url += "?" + "&".join(f"{k}={v}" for k, v in query.items())
    return connect(url, open_timeout=30, max_size=2**22)


def stream(ws: ClientConnection, samples: np.ndarray, rate: int = 16000, speed: float = 1.0):
    """Send audio in 100 ms chunks at `speed` x real time; return the send times of each
    chunk's end (seconds, perf_counter)."""
    step = int(rate * CHUNK_S)
    sent_at = []
    started = time.perf_counter()
    for i in range(0, len(samples), step):
        target = started + (i / rate) / speed
        delay = target - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        ws.send(pcm16(samples[i : i + step]))
        sent_at.append(time.perf_counter())
    return started, sent_at
