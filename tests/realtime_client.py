"""Helpers for driving /v1/realtime with the openai SDK's realtime client: send audio in
any session format at a chosen pace, and collect server events (each validated as the
SDK's types) until a condition holds."""

from __future__ import annotations

import base64
import threading
import time
from typing import Any

import numpy as np
import openai
import soxr
from pydantic import ValidationError

from contract import check_realtime_event
from qwen3_asr_server.audio import g711
from server import LiveServer
from streaming_client import pcm16

CHUNK_S = 0.1


def client_for(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


def encode(samples16k: np.ndarray, fmt: str) -> tuple[bytes, int]:
    """16 kHz float audio -> (bytes in the session format, bytes per CHUNK_S of audio):
    `pcm24` / `pcm8` (s16le at 24 / 8 kHz), `pcmu` / `pcma` (G.711 at 8 kHz)."""
    if fmt.startswith("pcm") and fmt[3:].isdigit():
        rate = int(fmt[3:]) * 1000
        audio = soxr.resample(samples16k, 16000, rate).astype(np.float32)
        return pcm16(audio), int(rate * CHUNK_S) * 2
    audio = soxr.resample(samples16k, 16000, 8000).astype(np.float32)
    return g711.encode(audio, "mulaw" if fmt == "pcmu" else "alaw"), int(8000 * CHUNK_S)


def send(conn: Any, data: bytes, chunk: int, speed: float = 1.0) -> None:
    """Append `data` in CHUNK_S pieces at `speed` x real time (1.0: real-time pace)."""
    started = time.perf_counter()
    for n, i in enumerate(range(0, len(data), chunk)):
        delay = started + n * CHUNK_S / speed - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        conn.input_audio_buffer.append(audio=base64.b64encode(data[i : i + chunk]).decode())


def collect(conn: Any, until: Any, timeout: float = 60.0) -> list[Any]:
    """Server events until `until(events)` holds (or the timeout, or the socket closes)."""
    events: list[Any] = []
    invalid: list[Exception] = []

    def reader() -> None:
        try:
            while True:
                raw = conn.recv_bytes()
                try:
                    events.append(check_realtime_event(raw))  # validated as the SDK's types
                except (ValidationError, AssertionError) as exc:
                    invalid.append(exc)
                    return
                if until(events):
                    return
        except Exception:  # the connection closed
            return

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    thread.join(timeout)
    if invalid:
        raise invalid[0]
    return events


def of_type(events: list[Any], suffix: str) -> list[Any]:
    return [e for e in events if e.type.endswith(suffix)]


def completed(events: list[Any]) -> list[Any]:
    return of_type(events, "input_audio_transcription.completed")
