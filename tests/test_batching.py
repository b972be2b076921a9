"""Engine batching through the API: results must match the unbatched ones, per request."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import openai
import pytest

import speech
from qwen3_asr_server.app import create_app
from qwen3_asr_server.config import Settings
from qwen3_asr_server.engines import create_engine
from server import LiveServer, live_server
from wer import normalize

pytestmark = pytest.mark.slow

FILES = ["sentence_02.wav", "sentence_08.wav", "sentence_09.wav", "sentence_10.wav"]


class SlowSingles:
    """The real engine; the first call (`held` requests) waits for `gate` (at most `delay`
    s) so that the others queue up behind it."""

    def __init__(self, engine: Any, delay: float) -> None:
        self.inner, self.delay = engine, delay
        self.gate = threading.Event()
        self.held = 0
        self.name, self.model_id = engine.name, engine.model_id
        self.batch_sizes: list[int] = []

    def _hold(self, requests: int) -> None:
        if not self.gate.is_set():
            self.held = requests
            self.gate.wait(self.delay)

    def __getattr__(self, item: str) -> Any:
        return getattr(self.inner, item)

    def transcribe(self, request: Any, should_stop: Any = None) -> Any:
        self._hold(1)
        return self.inner.transcribe(request)

    def transcribe_batch(self, requests: list[Any], should_stop: Any = None) -> list[Any]:
        self.batch_sizes.append(len(requests))
        self._hold(len(requests))
        return self.inner.transcribe_batch(requests)

    def decode_rows(self, source: Any) -> None:
        """Qwen's step loop: the rows of each decode step are counted."""
        sizes = self.batch_sizes

        class Counted:
            def __getattr__(self, item: str) -> Any:
                return getattr(source, item)

            def stepped(self, rows: int) -> None:
                sizes.append(rows)
                source.stepped(rows)

        self._hold(1)  # the others queue up meanwhile
        self.inner.decode_rows(Counted())


def concurrent(srv: LiveServer, files: list[str], engine: SlowSingles, **kw: Any) -> dict[str, str]:
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
    out: dict[str, str] = {}

    def one(name: str) -> None:
        result = client.audio.transcriptions.create(
            model="whisper-1", file=(name, speech.path(name).read_bytes()), **kw
        )
        out[name] = result.text

    threads = [threading.Thread(target=one, args=(name,)) for name in files]
    for t in threads:
        t.start()
    # the first call runs (held at the gate) and the rest queue behind it: then it opens
    scheduler, deadline = srv.ctx.scheduler, time.monotonic() + 120
    while not (engine.held and engine.held + scheduler.depth == len(files)):
        assert time.monotonic() < deadline, "the requests never queued up"
        time.sleep(0.01)
    engine.gate.set()
    for t in threads:
        t.join(120)
    return out


def run(settings: Settings, files: list[str], **kw: Any) -> tuple[dict[str, str], list[int]]:
    engine = SlowSingles(create_engine(settings), delay=120.0)
    with live_server(create_app(settings, engine=engine)) as srv:  # type: ignore[arg-type]
        texts = concurrent(srv, files, engine, **kw)
        assert srv.ctx.scheduler.depth == 0
    return texts, engine.batch_sizes


def test_whisper_batch_matches_unbatched_results() -> None:
    base: dict[str, object] = {"_env_file": None, "model_id": "whisper-tiny.en"}
    unbatched, sizes = run(Settings(**base, max_batch_size=1), FILES)  # type: ignore[arg-type]
    assert sizes == []
    batched, sizes = run(Settings(**base, max_batch_size=4), FILES)  # type: ignore[arg-type]
    assert sizes and max(sizes) >= 2  # requests that waited shared an engine call
    for name in FILES:
        assert normalize(batched[name]) == normalize(unbatched[name]), name
        assert normalize(batched[name])[:10] == normalize(speech.transcripts()[name])[:10]


def test_qwen_batch_matches_unbatched_results(tiny_qwen_dir: Path) -> None:
    """Qwen's step loop: requests that share decode steps get, each, the text it gets
    alone (the tiny checkpoint's text is noise, but the same noise: float32 on CPU)."""
    base: dict[str, object] = {"_env_file": None, "model_id": str(tiny_qwen_dir)}
    alone = Settings(**base, max_new_tokens=6, max_batch_size=1)  # type: ignore[arg-type]
    unbatched, sizes = run(alone, FILES, language="en")
    assert sizes == []  # each alone
    settings = Settings(**base, max_new_tokens=6, max_batch_size=4)  # type: ignore[arg-type]
    batched, sizes = run(settings, FILES, language="en")
    assert sizes and max(sizes) >= 2  # requests that waited shared decode steps
    assert set(batched) == set(unbatched) == set(FILES)
    for name in FILES:
        assert batched[name] and batched[name] == unbatched[name], name
