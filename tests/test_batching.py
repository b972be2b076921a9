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
from wer import normalize, wer

pytestmark = pytest.mark.slow

FILES = ["sentence_02.wav", "sentence_08.wav", "sentence_09.wav", "sentence_10.wav"]


class SlowSingles:
    """The real engine, with single (unbatched) calls slowed so that others queue up."""

    def __init__(self, engine: Any, delay: float) -> None:
        self.inner, self.delay = engine, delay
        self.name, self.model_id = engine.name, engine.model_id
        self.batch_sizes: list[int] = []

    def __getattr__(self, item: str) -> Any:
        return getattr(self.inner, item)

    def transcribe(self, request: Any, should_stop: Any = None) -> Any:
        time.sleep(self.delay)
        return self.inner.transcribe(request)

    def transcribe_batch(self, requests: list[Any], should_stop: Any = None) -> list[Any]:
        self.batch_sizes.append(len(requests))
        return self.inner.transcribe_batch(requests)


def concurrent(srv: LiveServer, files: list[str], **kw: Any) -> dict[str, str]:
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
    out: dict[str, str] = {}

    def one(name: str) -> None:
        result = client.audio.transcriptions.create(
            model="whisper-1", file=(name, speech.path(name).read_bytes()), **kw
        )
        out[name] = result.text

    threads = []
    for name in files:
        threads.append(threading.Thread(target=one, args=(name,)))
        threads[-1].start()
        time.sleep(0.1)  # the first starts running, the rest queue behind it
    for t in threads:
        t.join(120)
    return out


def run(settings: Settings, files: list[str], **kw: Any) -> tuple[dict[str, str], list[int]]:
    engine = SlowSingles(create_engine(settings), delay=1.0)
    with live_server(create_app(settings, engine=engine)) as srv:  # type: ignore[arg-type]
        texts = concurrent(srv, files, **kw)
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


def test_qwen_batch_keeps_requests_apart(tiny_qwen_dir: Path) -> None:
    base: dict[str, object] = {"_env_file": None, "model_id": str(tiny_qwen_dir)}
    settings = Settings(**base, max_new_tokens=6, max_batch_size=4)  # type: ignore[arg-type]
    texts, sizes = run(settings, FILES, language="en")
    assert sizes and max(sizes) >= 2
    assert set(texts) == set(FILES)


class Calls:
    """The real engine; records each engine call as the number of jobs it ran."""

    def __init__(self, engine: Any) -> None:
        self.inner = engine
        self.name, self.model_id = engine.name, engine.model_id
        self.calls: list[int] = []

    def __getattr__(self, item: str) -> Any:
        return getattr(self.inner, item)

    def transcribe(self, request: Any, should_stop: Any = None) -> Any:
        self.calls.append(1)
        return self.inner.transcribe(request)

    def transcribe_batch(self, requests: list[Any], should_stop: Any = None) -> list[Any]:
        self.calls.append(len(requests))
        return self.inner.transcribe_batch(requests)


def long_upload(max_batch: int, max_queue: int = 64) -> tuple[list[Any], list[int]]:
    base = {"_env_file": None, "model_id": "whisper-tiny.en", "idle_timeout": 0}
    settings = Settings(**base, max_batch_size=max_batch, max_queue=max_queue)  # type: ignore[arg-type]
    engine = Calls(create_engine(settings))
    with live_server(create_app(settings, engine=engine)) as srv:  # type: ignore[arg-type]
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
        with open(speech.path("long_2min.wav"), "rb") as f:
            events = list(
                client.audio.transcriptions.create(model="whisper-1", file=f, stream=True)
            )
        assert srv.ctx.scheduler.depth == 0
    return events, engine.calls


def test_one_long_upload_batches_its_own_segments() -> None:
    """The first segment runs alone (an early first delta), the ones cut meanwhile share
    engine calls; the text is as accurate as unbatched, the deltas in order."""
    single_events, single_calls = long_upload(max_batch=1)
    events, calls = long_upload(max_batch=4)
    assert set(single_calls) == {1} and len(single_calls) >= 4
    assert calls[0] == 1 and max(calls) >= 2 and sum(calls) == len(single_calls)
    done = [e.text for e in events if e.type == "transcript.text.done"]
    single_done = [e.text for e in single_events if e.type == "transcript.text.done"]
    ref = [speech.transcripts()["long_2min.wav"]]
    batched, alone = wer(ref, done), wer(ref, single_done)
    assert batched <= alone + 0.03, (batched, alone)  # batched decoding differs a little
    deltas = "".join(e.delta for e in events if e.type == "transcript.text.delta")
    assert normalize(deltas) == normalize(done[0])


def test_look_ahead_segments_never_fail_an_upload_on_a_small_queue() -> None:
    """MAX_QUEUE=2: the upload's own look-ahead segments find the queue full, and go again
    one at a time instead of failing the request with 503."""
    events, _ = long_upload(max_batch=4, max_queue=2)
    done = [e.text for e in events if e.type == "transcript.text.done"]
    assert len(done) == 1 and len(done[0].split()) > 200


def test_no_look_ahead_while_streams_are_live() -> None:
    """A streaming job came in the last seconds: the upload's segments go one at a time,
    so a final never waits behind a queue of them."""
    import asyncio

    from qwen3_asr_server.scheduler import REALTIME

    base = {"_env_file": None, "model_id": "whisper-tiny.en", "idle_timeout": 0}
    settings = Settings(**base, max_batch_size=4)  # type: ignore[arg-type]
    engine = Calls(create_engine(settings))
    depths: list[int] = []
    with live_server(create_app(settings, engine=engine)) as srv:  # type: ignore[arg-type]
        scheduler = srv.ctx.scheduler
        inner = engine.transcribe

        def transcribe(request: Any, should_stop: Any = None) -> Any:
            depths.append(scheduler.depth)
            return inner(request, should_stop)

        engine.transcribe = transcribe  # type: ignore[method-assign]
        job = scheduler.submit(lambda: None, priority=REALTIME)
        asyncio.run_coroutine_threadsafe(job, srv.server_loop).result(10)
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
        with open(speech.path("long_2min.wav"), "rb") as f:
            text = client.audio.transcriptions.create(model="whisper-1", file=f).text
    assert len(text.split()) > 200
    assert set(engine.calls) == {1} and len(engine.calls) >= 4
    assert max(depths) == 0  # nothing of the upload waited behind the running segment
