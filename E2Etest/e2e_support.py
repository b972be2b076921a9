"""Shared helpers for the black-box suite: settings from the environment, the speech clips,
word error rate, SSE parsing and a small /ws/transcribe client.

Nothing here imports the server package: the suite talks to a running deployment over HTTP
and WebSocket only (httpx, the openai SDK, websockets).
"""

from __future__ import annotations

import array
import json
import os
import re
import sys
import threading
import time
import wave
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from websockets.sync.client import ClientConnection, connect

REPO = Path(__file__).resolve().parent.parent

BASE_URL = (os.environ.get("E2E_BASE_URL") or "http://localhost:8100").rstrip("/")
API_KEY = os.environ.get("E2E_API_KEY") or None
AUDIO_DIR = Path(os.environ.get("E2E_AUDIO_DIR") or REPO / "tests" / "data" / "speech")
# Per HTTP request. The first request may load the model (minutes for Qwen on a CPU).
TIMEOUT = float(os.environ.get("E2E_TIMEOUT") or 300)
# How long a streaming test waits for one expected message (a final, a done event).
WAIT = float(os.environ.get("E2E_WAIT") or 60)

# whisper-tiny.en on the committed espeak clips scores WER ~0.2 (one sentence of twelve is
# badly wrong); Qwen does better. A broken deployment scores ~1.0. Loose on purpose.
WER_BOUND = float(os.environ.get("E2E_WER_BOUND") or 0.5)


def auth_headers(key: str | None = API_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


# --- audio -------------------------------------------------------------------------------


@dataclass
class Clip:
    """One speech clip and its reference transcript (from transcripts.json)."""

    name: str
    path: Path
    transcript: str

    @cached_property
    def data(self) -> bytes:
        return self.path.read_bytes()

    @cached_property
    def wav(self) -> tuple[int, bytes] | None:
        """(sample rate, PCM s16le mono) when the file is a 16-bit PCM WAV, else None."""
        try:
            with wave.open(str(self.path), "rb") as w:
                if w.getsampwidth() != 2:
                    return None
                rate, channels = w.getframerate(), w.getnchannels()
                frames = w.readframes(w.getnframes())
        except (wave.Error, EOFError):
            return None
        if channels > 1:  # keep the first channel
            samples = array.array("h", frames)
            if sys.byteorder == "big":
                samples.byteswap()
            mono = array.array("h", samples[::channels])
            if sys.byteorder == "big":
                mono.byteswap()
            frames = mono.tobytes()
        return rate, frames

    @property
    def rate(self) -> int:
        assert self.wav, f"{self.name} is not a 16-bit PCM WAV"
        return self.wav[0]

    @property
    def pcm(self) -> bytes:
        assert self.wav, f"{self.name} is not a 16-bit PCM WAV"
        return self.wav[1]

    @property
    def duration(self) -> float:
        if self.wav:
            return len(self.wav[1]) / 2 / self.wav[0]
        return float("nan")

    def pcm_with_silence(self, seconds: float) -> bytes:
        return self.pcm + silence(self.rate, seconds)


def streamable(clip: Clip, rates: tuple[int, ...]) -> Clip:
    """The clip if it can be streamed as raw PCM at one of `rates`; else skip the test."""
    if clip.wav is None or clip.rate not in rates:
        pytest.skip(f"{clip.name} is not a 16-bit PCM WAV at one of {rates} Hz")
    return clip


def silence(rate: int, seconds: float) -> bytes:
    return bytes(2 * int(rate * seconds))


def load_clips(directory: Path = AUDIO_DIR) -> dict[str, Clip]:
    """Every clip named in transcripts.json that exists, by file name."""
    index = directory / "transcripts.json"
    if not index.is_file():
        raise FileNotFoundError(
            f"{index} not found: E2E_AUDIO_DIR must hold the clips and a transcripts.json "
            '({"file.wav": "reference transcript", ...})'
        )
    names: dict[str, str] = json.loads(index.read_text(encoding="utf-8"))
    return {
        name: Clip(name, directory / name, text)
        for name, text in sorted(names.items())
        if (directory / name).is_file()
    }


# --- word error rate ---------------------------------------------------------------------

ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def number_words(n: int) -> str:
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else " " + ONES[n % 10])
    if n < 1000:
        rest = "" if n % 100 == 0 else " " + number_words(n % 100)
        return ONES[n // 100] + " hundred" + rest
    if n < 1_000_000:
        rest = "" if n % 1000 == 0 else " " + number_words(n % 1000)
        return number_words(n // 1000) + " thousand" + rest
    return str(n)


def normalize(text: str) -> str:
    """Lower case, no punctuation, numbers as words (the main suite's normalisation)."""
    text = text.lower().replace("-", " ")
    text = re.sub(r"\d+", lambda m: " " + number_words(int(m.group())) + " ", text)
    text = re.sub(r"[^\w\s']", " ", text).replace("'", "")
    return " ".join(text.split())


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1]


def wer(references: Iterable[str], hypotheses: Iterable[str]) -> float:
    """Corpus word error rate: all edits over all reference words."""
    errors = words = 0
    for ref, hyp in zip(references, hypotheses, strict=True):
        r, h = normalize(ref).split(), normalize(hyp).split()
        errors += edit_distance(r, h)
        words += len(r)
    return errors / max(words, 1)


# --- subtitles ---------------------------------------------------------------------------

TIME = re.compile(r"^(\d{2,}):(\d{2}):(\d{2})[,.](\d{3})$")


def seconds(stamp: str) -> float:
    m = TIME.match(stamp.strip())
    assert m, f"not a subtitle timestamp: {stamp!r}"
    h, mi, s, ms = (int(g) for g in m.groups())
    return h * 3600 + mi * 60 + s + ms / 1000


@dataclass
class Cue:
    start: float
    end: float
    lines: list[str]

    @property
    def text(self) -> str:
        return " ".join(self.lines)


def parse_srt(body: str) -> list[Cue]:
    cues = []
    blocks = [b for b in re.split(r"\n\s*\n", body.replace("\r\n", "\n").strip()) if b.strip()]
    for number, block in enumerate(blocks, 1):
        lines = block.split("\n")
        assert lines[0].strip() == str(number), f"SRT cue {number} numbered {lines[0]!r}"
        start, arrow, end = lines[1].partition(" --> ")
        assert arrow, f"SRT cue {number} has no timing line: {lines[1]!r}"
        assert "," in start, f"SRT uses a comma before milliseconds: {lines[1]!r}"
        cues.append(Cue(seconds(start), seconds(end), lines[2:]))
    return cues


def parse_vtt(body: str) -> list[Cue]:
    body = body.replace("\r\n", "\n")
    assert body.startswith("WEBVTT"), body[:40]
    cues = []
    for block in re.split(r"\n\s*\n", body.strip())[1:]:
        lines = [line for line in block.split("\n") if line.strip()]
        timing = next(i for i, line in enumerate(lines) if "-->" in line)
        start, _, rest = lines[timing].partition(" --> ")
        end = rest.split()[0]
        assert "." in start, f"WebVTT uses a dot before milliseconds: {lines[timing]!r}"
        cues.append(Cue(seconds(start), seconds(end), lines[timing + 1 :]))
    return cues


# --- server-sent events --------------------------------------------------------------------


def sse_data(lines: Iterable[str]) -> Iterator[str]:
    """The `data:` payloads of an event stream, in order (one per event)."""
    buffer: list[str] = []
    for line in lines:
        if line.startswith("data:"):
            buffer.append(line[5:].removeprefix(" "))
        elif line == "" and buffer:
            yield "\n".join(buffer)
            buffer = []
    if buffer:
        yield "\n".join(buffer)


# --- WebSocket ---------------------------------------------------------------------------


def ws_url(path: str, **query: Any) -> str:
    url = re.sub(r"^http", "ws", BASE_URL) + path
    if query:
        url += "?" + urlencode(query)
    return url


def ws_connect(
    path: str, key: str | None = API_KEY, subprotocols: list[str] | None = None, **query: Any
) -> ClientConnection:
    return connect(
        ws_url(path, **query),
        additional_headers=auth_headers(key),
        subprotocols=subprotocols,  # type: ignore[arg-type]
        open_timeout=30,
        close_timeout=10,
        max_size=2**24,
    )


class Messages:
    """Reads every JSON message of a socket on a background thread."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.items: list[dict[str, Any]] = []
        self.closed = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for raw in self.ws:
                self.items.append(json.loads(raw))
        except Exception:  # the socket closed
            pass
        finally:
            self.closed.set()

    def wait_for(self, predicate: Callable[[Messages], Any], timeout: float = WAIT) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            if self.closed.is_set():
                return bool(predicate(self))
            time.sleep(0.02)
        return False

    def finals(self) -> list[dict[str, Any]]:
        return [m for m in self.items if m.get("is_final") is True]

    def partials(self) -> list[dict[str, Any]]:
        return [m for m in self.items if m.get("is_partial") is True]

    def with_status(self, status: str) -> list[dict[str, Any]]:
        return [m for m in self.items if m.get("status") == status]

    def errors(self) -> list[dict[str, Any]]:
        return [m for m in self.items if "code" in m and "statusCode" in m]


def send_pcm(ws: ClientConnection, pcm: bytes, rate: int, speed: float = 1.0) -> None:
    """Send PCM s16le in 100 ms frames at `speed` times real time."""
    step = 2 * rate // 10
    started = time.monotonic()
    for i in range(0, len(pcm), step):
        delay = started + (i / 2 / rate) / speed - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        ws.send(pcm[i : i + step])
