"""ENGINE=remote: a front that sends every job to other instances of this server (real
processes on loopback, the bundled whisper model) and keeps priorities, spreads the work,
survives a backend killed with SIGKILL and answers 503 naming the backends when all are down.
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import soxr
from prometheus_client.parser import text_string_to_metric_families

import speech
from proc import WHISPER_BACKEND_ENV, ServerProcess
from server import free_port
from streaming_client import Collector, load, open_ws, pcm16, stream

pytestmark = pytest.mark.slow


def backend(port: int | None = None) -> ServerProcess:
    proc = ServerProcess(WHISPER_BACKEND_ENV, port=port)
    proc.wait_healthy(60)
    return proc


def front_env(urls: list[str], **extra: str) -> dict[str, str]:
    return {
        "ENGINE": "remote",
        "REMOTE_BACKENDS": ",".join(urls),
        "REMOTE_MAX_INFLIGHT": "1",
        "REMOTE_PROBE_INTERVAL": "1",
        "IDLE_TIMEOUT": "0",
        "PRELOAD": "true",
        "LOG_LEVEL": "INFO",
        **extra,
    }


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, Any]]:
    backends = [backend() for _ in range(3)]
    front = ServerProcess(front_env([b.url + "/v1" for b in backends]))
    try:
        front.wait_healthy()
        wait_until(lambda: health(front)["backends_up"] == 3, 30)
        yield {"front": front, "backends": backends}
    finally:
        front.stop()
        for b in backends:
            b.stop()


def wait_until(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError("condition not met")


def health(server: ServerProcess) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(server.url + "/health", timeout=5).json()
    return body


def answered(front: ServerProcess) -> list[int]:
    return [b["requests"] for b in health(front)["backends"]]


def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


def transcribe(server: ServerProcess, name: str, **kwargs: Any) -> Any:
    with open(speech.path(name), "rb") as f:
        return client(server).audio.transcriptions.create(model="whisper-1", file=f, **kwargs)


def sse_text(server: ServerProcess, name: str) -> str:
    done = [e for e in transcribe(server, name, stream=True) if e.type == "transcript.text.done"]
    assert len(done) == 1
    return str(done[0].text)


def ws_final(server: ServerProcess, samples: np.ndarray) -> str:
    with open_ws(server.url, use_server_vad="false") as ws:
        got = Collector(ws)
        assert got.wait_for(lambda c: c.messages, 10)
        stream(ws, samples, speed=8)
        ws.send('{"action": "flush"}')
        assert got.wait_for(lambda c: c.finals(), 60)
    return got.finals()[0]


def realtime_final(server: ServerProcess, samples: np.ndarray) -> str:
    with client(server).realtime.connect(extra_query={"intent": "transcription"}) as conn:
        assert conn.recv().type == "session.created"
        conn.send(
            {
                "type": "transcription_session.update",
                "session": {
                    "turn_detection": None,
                    "input_audio_transcription": {"language": "en"},
                },
            }
        )
        assert conn.recv().type == "transcription_session.updated"
        audio24k = soxr.resample(samples, 16000, 24000).astype(np.float32)
        for i in range(0, len(audio24k), 4800):
            conn.input_audio_buffer.append(
                audio=base64.b64encode(pcm16(audio24k[i : i + 4800])).decode()
            )
        conn.input_audio_buffer.commit()
        for event in conn:
            if event.type == "conversation.item.input_audio_transcription.completed":
                return str(event.transcript)
            assert event.type != "error", event
    raise AssertionError("no transcript")


def test_every_route_gives_the_same_text_as_a_direct_call(cluster: dict[str, Any]) -> None:
    front, direct = cluster["front"], cluster["backends"][0]
    for name in ("sentence_01.wav", "three_sentences.wav"):
        text = transcribe(front, name).text
        assert text and text == transcribe(direct, name).text
        assert transcribe(front, name, response_format="text") == text
        assert sse_text(front, name) == sse_text(direct, name)
    samples = load("sentence_02.wav")
    assert ws_final(front, samples) == ws_final(direct, samples)
    assert realtime_final(front, samples) == realtime_final(direct, samples)
    verbose = transcribe(
        front, "sentence_03.wav", response_format="verbose_json", timestamp_granularities=["word"]
    )
    assert verbose.words and verbose.words[-1].end <= verbose.duration + 0.01
    assert verbose.word_timestamps == "estimate"  # backends answer text: words are spread
    direct_words = transcribe(
        direct, "sentence_03.wav", response_format="verbose_json", timestamp_granularities=["word"]
    )
    assert direct_words.word_timestamps == "native"  # whisper's own word times


def test_a_long_upload_is_spread_over_the_backends(cluster: dict[str, Any]) -> None:
    front = cluster["front"]
    before = answered(front)
    text = transcribe(front, "long_2min.wav").text
    after = answered(front)
    assert len(text.split()) > 200
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)


def test_a_final_goes_before_queued_upload_segments(cluster: dict[str, Any]) -> None:
    front = cluster["front"]
    pool = ThreadPoolExecutor(3)
    uploads = [pool.submit(transcribe, front, "long_2min.wav") for _ in range(3)]
    wait_until(lambda: health(front)["queue_depth"] >= 4, 30)  # 3 running, the rest queued
    before = sum(answered(front))
    final = ws_final(front, load("sentence_01.wav"))
    jobs_between = sum(answered(front)) - before
    uploads_done = sum(u.done() for u in uploads)
    for u in uploads:
        assert len(u.result().text.split()) > 200
    pool.shutdown()
    assert "quick" in final.lower()
    # FIFO would have run every queued segment first (≥ 4 + 3 running); the final only
    # waited for a slot: the segments already running, then itself (+ a short one beside).
    assert jobs_between <= 5, jobs_between
    assert uploads_done == 0


def test_a_backend_killed_during_a_burst(cluster: dict[str, Any]) -> None:
    front, backends = cluster["front"], cluster["backends"]
    names = sorted(speech.sentences())
    finished: list[int] = []

    def one(i: int) -> str:
        with open(speech.path(names[i % len(names)]), "rb") as f:
            r = httpx.post(front.url + "/v1/audio/transcriptions", files={"file": f}, timeout=120)
        finished.append(r.status_code)
        assert r.status_code == 200, r.text
        return str(r.json()["text"])

    victim = backends[2]
    with ThreadPoolExecutor(6) as pool:
        results = [pool.submit(one, i) for i in range(30)]
        wait_until(lambda: len(finished) >= 5, 60)
        victim.proc.kill()  # SIGKILL: connections reset, nothing answered
        texts = [r.result() for r in results]
    assert all(texts) and finished.count(200) == 30
    state = health(front)["backends"][2]
    assert state["state"] == "down" and state["last_error"], state
    victim.proc.wait()

    backends[2] = backend(victim.port)  # restarted on the same port
    wait_until(lambda: health(front)["backends"][2]["state"] == "up", 30)
    before = answered(front)[2]
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(one, range(6)))
    assert answered(front)[2] > before


def test_all_backends_down_then_one_comes_back() -> None:
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}/v1" for p in ports]
    front = ServerProcess(front_env(urls))
    revived = None
    try:
        front.wait_healthy()
        with open(speech.path("sentence_01.wav"), "rb") as f:
            data = f.read()
        r = httpx.post(front.url + "/v1/audio/transcriptions", files={"file": ("a.wav", data)})
        assert r.status_code == 503, r.text
        error = r.json()["error"]
        assert error["code"] == "backends_unavailable"
        assert all(url in error["message"] for url in urls)
        assert int(r.headers["Retry-After"]) >= 1
        assert health(front)["backends_up"] == 0

        revived = backend(ports[1])
        statuses: list[int] = []

        def served() -> bool:
            files = {"file": ("a.wav", data)}
            r = httpx.post(front.url + "/v1/audio/transcriptions", files=files, timeout=60)
            statuses.append(r.status_code)
            return r.status_code == 200 and "quick" in r.json()["text"].lower()

        wait_until(served, 30)
        assert set(statuses) <= {200, 503}
        assert health(front)["backends"][1]["state"] == "up"
    finally:
        front.stop()
        if revived is not None:
            revived.stop()


def test_metrics_show_each_backend(cluster: dict[str, Any]) -> None:
    front = cluster["front"]
    transcribe(front, "sentence_04.wav")
    text = httpx.get(front.url + "/metrics").text
    for b in cluster["backends"]:
        label = f'backend="{b.url}/v1"'
        assert f"asr_backend_up{{{label}}}" in text
        assert f"asr_backend_requests_total{{{label}}}" in text
    assert "asr_backend_inflight" in text and "asr_backend_errors_total" in text


def samples_of(metrics: str, name: str) -> dict[str, float]:
    """Every sample of the family `name` in a Prometheus exposition: {labels + suffix: value}."""
    out = {}
    for family in text_string_to_metric_families(metrics):
        if family.name == name:
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                out[sample.name.removeprefix(name) + "{" + labels + "}"] = sample.value
    return out


def test_metrics_show_streams_voice_detection_and_backend_times(cluster: dict[str, Any]) -> None:
    """What an operator scales fronts by (issue 34), after one real stream with server VAD:
    its messages' lag, the batched voice detection's time and frames, how long jobs waited
    for a backend slot, and each backend's answer times, one per answered job."""
    front = cluster["front"]
    samples = np.concatenate([load("sentence_01.wav"), np.zeros(16000, np.float32)])
    with open_ws(front.url) as ws:
        got = Collector(ws)
        assert got.wait_for(lambda c: c.messages, 10)
        sent = len(stream(ws, samples, speed=4))
        assert got.wait_for(lambda c: c.finals(), 60)
    assert "quick" in got.finals()[0].lower()
    scrape: list[str] = []
    jobs: list[int] = []

    def settled() -> bool:  # no job ended between the two reads of /health (a late partial)
        before = sum(answered(front))
        scrape[:] = [httpx.get(front.url + "/metrics").text]
        jobs[:] = [before]
        return sum(answered(front)) == before

    wait_until(settled, 30)
    text, answered_jobs = scrape[0], jobs[0]
    vad = {
        name: samples_of(text, name)["_total{}"]
        for name in ("asr_vad_frames", "asr_vad_seconds", "asr_vad_calls")
    }
    assert vad["asr_vad_frames"] >= len(samples) // 512 - 1, vad
    assert vad["asr_vad_seconds"] > 0 and 1 <= vad["asr_vad_calls"] <= vad["asr_vad_frames"]
    lag = samples_of(text, "asr_stream_lag_seconds")
    assert lag["_count{}"] >= sent and lag["_bucket{le=+Inf}"] == lag["_count{}"]
    assert samples_of(text, "asr_stream_max_lag_seconds")["{}"] >= 0
    assert "asr_stream_pending_final_seconds" in text and "asr_vad_wait_seconds" in text
    latency = samples_of(text, "asr_backend_latency_seconds")
    counts = [v for k, v in latency.items() if k.startswith("_count")]
    assert len(counts) == len(cluster["backends"]) and sum(counts) == answered_jobs > 0
    assert all(v >= 0 for k, v in latency.items() if k.startswith("_sum"))
    wait = samples_of(text, "asr_backend_slot_wait_seconds")
    assert wait["_count{}"] >= answered_jobs


def test_a_bad_request_comes_back_as_400_without_marking_backends_down(
    cluster: dict[str, Any],
) -> None:
    front = cluster["front"]
    with pytest.raises(openai.BadRequestError) as info:
        transcribe(front, "sentence_01.wav", language="xx")
    assert "language" in str(info.value).lower()
    assert health(front)["backends_up"] == 3


def test_settings_refuse_remote_without_backends() -> None:
    from pydantic import ValidationError

    from qwen3_asr_server.config import Settings

    with pytest.raises(ValidationError, match="REMOTE_BACKENDS"):
        Settings(_env_file=None, engine="remote")  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="not an http"):
        Settings(_env_file=None, engine="remote", remote_backends="gpu-a:8000")  # type: ignore[call-arg]


def test_threads_start_and_stop_with_the_scheduler() -> None:
    from qwen3_asr_server.runtime.scheduler import PriorityScheduler

    scheduler = PriorityScheduler(4, workers=3)
    scheduler.start()
    names = {t.name for t in threading.enumerate() if t.name.startswith("inference-")}
    scheduler.stop()
    assert names == {"inference-0", "inference-1", "inference-2"}


@contextmanager
def run_standin(*args: str) -> Iterator[str]:
    """tests/vllm_standin.py as its own process."""
    port = free_port()
    script = Path(__file__).resolve().parent / "vllm_standin.py"
    proc = subprocess.Popen([sys.executable, str(script), str(port), *args])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(url + "/health", timeout=1).status_code == 200, 30)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture()
def standin() -> Iterator[str]:
    with run_standin("--api-key", "sekret") as url:
        yield url


@pytest.mark.parametrize("named", [True, False])
def test_an_offline_front_never_looks_for_the_model_itself(standin: str, named: bool) -> None:
    """issue 41: with HF_HUB_OFFLINE=1 a front refused every request with 503 "The model
    'Qwen/Qwen3-ASR-1.7B' is not on this machine" (REMOTE_MODEL, vLLM's served name), or
    looked for a model named `remote` (REMOTE_MODEL unset). The front holds no model."""
    extra = {"REMOTE_API_KEY": "sekret", "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": "/nonexistent"}
    if named:
        extra["REMOTE_MODEL"] = "Qwen/Qwen3-ASR-1.7B"
    front = ServerProcess(front_env([standin + "/v1"], **extra))
    try:
        front.wait_healthy()
        wait_until(lambda: health(front)["backends_up"] == 1, 30)
        assert transcribe(front, "sentence_01.wav").text.startswith("stand-in heard")
        assert health(front)["model_id"] == "Qwen/Qwen3-ASR-1.7B"
    finally:
        front.stop()
    env = {**os.environ, **extra, "ENGINE": "remote", "REMOTE_BACKENDS": standin + "/v1"}
    for command in ("check", "download"):
        done = subprocess.run(
            [sys.executable, "-m", "qwen3_asr_server", command],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert "HF cache" not in done.stdout and "Qwen3-ASR-0.6B" not in done.stdout, done.stdout


def test_a_hung_backend_leaves_the_rotation_until_a_job_succeeds() -> None:
    """issue 41: a backend whose engine hangs while /v1/models still answers stayed in the
    rotation: with REQUEST_TIMEOUT=5, uploads alternated 504, 200, 504, ... The call to a
    backend now times out first (half the job's time), the job moves to the healthy one, and
    the hung backend comes back only when a trial job succeeds, not when a probe answers."""
    with run_standin("--gate") as hung, run_standin() as healthy:
        env = front_env([hung + "/v1", healthy + "/v1"], REQUEST_TIMEOUT="5")
        front = ServerProcess(env)
        try:
            front.wait_healthy()
            wait_until(lambda: health(front)["backends_up"] == 2, 30)
            for _ in range(6):
                assert transcribe(front, "sentence_01.wav").text.startswith("stand-in heard")
            state = {b["url"]: b for b in health(front)["backends"]}
            stuck = state[hung + "/v1"]
            assert stuck["state"] == "down" and "timed out on a job" in stuck["last_error"]
            # its /v1/models answers every probe (1 s apart), yet it stays out: trials time out
            wait_until(lambda: "trial job" in str(backend_state(front, hung)["last_error"]), 30)
            assert backend_state(front, hung)["state"] == "down"
            httpx.post(hung + "/open", timeout=5)  # the engine recovers: a trial job succeeds
            wait_until(lambda: backend_state(front, hung)["state"] == "up", 30)
            assert health(front)["backends_up"] == 2
        finally:
            front.stop()


def backend_state(front: ServerProcess, url: str) -> dict[str, Any]:
    return next(b for b in health(front)["backends"] if b["url"] == url + "/v1")


def test_the_front_sends_only_what_vllm_accepts(standin: str) -> None:
    front = ServerProcess(front_env([standin + "/v1"], REMOTE_API_KEY="sekret"))
    try:
        front.wait_healthy()
        wait_until(lambda: health(front)["backends_up"] == 1, 30)
        assert health(front)["model_id"] == "Qwen/Qwen3-ASR-1.7B"  # from the backend's list
        text = transcribe(
            front, "sentence_01.wav", language="en", prompt="Names: Qwen", temperature=0.2
        ).text
        assert text.startswith("stand-in heard 3.")
        for fmt in ("verbose_json", "srt", "vtt", "text"):
            assert transcribe(front, "sentence_02.wav", response_format=fmt)
        assert sse_text(front, "three_sentences.wav").startswith("stand-in heard")
        assert len(transcribe(front, "long_2min.wav").text.split("stand-in")) > 4
        assert ws_final(front, load("sentence_03.wav")).startswith("stand-in heard")
        seen = httpx.get(standin + "/seen").json()
    finally:
        front.stop()
    assert len(seen) >= 10
    allowed = {"model", "language", "prompt", "temperature", "response_format"}
    for record in seen:
        assert record["problems"] == [], record
        assert set(record["fields"]) <= allowed, record
        assert record["fields"]["model"] == "Qwen/Qwen3-ASR-1.7B"
        assert record["fields"]["response_format"] == "json"
        assert (record["sample_rate"], record["channels"]) == (16000, 1)
        assert record["seconds"] <= 30.5  # segments, never the whole 2-minute file
    first = seen[0]["fields"]
    assert (first["language"], first["prompt"], float(first["temperature"])) == (
        "en",
        "Names: Qwen",
        0.2,
    )


def test_a_wrong_backend_key_is_named(standin: str) -> None:
    front = ServerProcess(front_env([standin + "/v1"], REMOTE_API_KEY="wrong"))
    try:
        front.wait_healthy()
        wait_until(lambda: health(front)["model_loaded"], 30)
        state = health(front)["backends"][0]
        assert state["state"] == "down" and "REMOTE_API_KEY" in state["last_error"]
        with pytest.raises(openai.APIStatusError) as info:
            transcribe(front, "sentence_01.wav")
        assert info.value.status_code == 503 and "REMOTE_API_KEY" in str(info.value)
    finally:
        front.stop()


def test_credentials_in_a_backend_url_are_sent_and_never_shown() -> None:
    """`http://user:pass@host/v1`: the backend gets Basic auth (not REMOTE_API_KEY's bearer),
    and /health, /metrics, a 503 body and the log show `user:***` and never the password."""
    secret = "hunter2"
    shown: list[str] = []
    front = None
    try:
        with run_standin("--basic", f"asr:{secret}/x") as url:
            host = url.removeprefix("http://")
            dead = f"127.0.0.1:{free_port()}"
            urls = [f"http://asr:{secret}%2Fx@{host}/v1", f"http://asr:{secret}%2Fx@{dead}/v1"]
            front = ServerProcess(front_env(urls, REMOTE_API_KEY="bearer-key"))
            front.wait_healthy()
            wait_until(lambda: health(front)["backends_up"] == 1, 30)
            state = health(front)
            assert [b["url"] for b in state["backends"]] == [
                f"http://asr:***@{host}/v1",
                f"http://asr:***@{dead}/v1",
            ]
            assert transcribe(front, "sentence_01.wav").text.startswith("stand-in heard")
            assert len(httpx.get(url + "/seen").json()) == 1  # the Basic auth got through
            metrics = httpx.get(front.url + "/metrics").text
            assert f'asr_backend_up{{backend="http://asr:***@{host}/v1"}} 1.0' in metrics
            shown += [str(state), str(health(front)), metrics]
        with open(speech.path("sentence_01.wav"), "rb") as f:  # the stand-in is gone now
            r = httpx.post(front.url + "/v1/audio/transcriptions", files={"file": ("a.wav", f)})
        assert r.status_code == 503 and f"http://asr:***@{host}/v1" in r.text, r.text
        shown += [r.text, str(health(front)), httpx.get(front.url + "/metrics").text]
    finally:
        log = front.output() if front is not None else ""
    assert "asr:***@" in log and f"asr:***@{dead}/v1 is down" in log
    for text in [*shown, log]:
        assert secret not in text


def disconnect_seen(url: str) -> list[dict[str, Any]]:
    """The stand-in's requests, once it has noticed the last one's caller left (it polls
    every 20 ms, and a busy machine can notice after the front has let go)."""
    wait_until(lambda: "disconnected" in httpx.get(url + "/seen").json()[-1], 10)
    seen: list[dict[str, Any]] = httpx.get(url + "/seen").json()
    return seen


def test_a_job_whose_caller_left_is_cancelled_on_the_backend() -> None:
    """The backend takes 8 s per job. A 504 at REQUEST_TIMEOUT=1 and an SSE client that
    leaves both close the backend connection at once (vLLM aborts such a request)."""
    with run_standin("--delay", "8") as url:
        front = ServerProcess(front_env([url + "/v1"], REQUEST_TIMEOUT="1"))
        try:
            front.wait_healthy()
            wait_until(lambda: health(front)["backends_up"] == 1, 30)
            with pytest.raises(openai.APIStatusError) as info:
                transcribe(front, "sentence_01.wav")
            assert info.value.status_code == 504
            left_at = time.time()
            wait_until(lambda: health(front)["backends"][0]["inflight"] == 0, 3)
            seen = disconnect_seen(url)
            assert seen[-1]["disconnected"] - left_at < 2.0

            front_sse = ServerProcess(front_env([url + "/v1"]))
            try:
                front_sse.wait_healthy()
                wait_until(lambda: health(front_sse)["backends_up"] == 1, 30)
                with open(speech.path("sentence_02.wav"), "rb") as f:
                    files = {"file": ("a.wav", f.read())}
                with httpx.stream(
                    "POST",
                    front_sse.url + "/v1/audio/transcriptions",
                    files=files,
                    data={"stream": "true"},
                    timeout=30,
                ) as r:
                    assert r.status_code == 200
                    wait_until(lambda: health(front_sse)["backends"][0]["inflight"] == 1, 5)
                left_at = time.time()  # the client closed the stream
                wait_until(lambda: health(front_sse)["backends"][0]["inflight"] == 0, 3)
                seen = disconnect_seen(url)
                assert seen[-1]["disconnected"] - left_at < 2.0
                assert health(front_sse)["backends"][0]["errors"] == 0  # cancelled, not failed
            finally:
                front_sse.stop()
        finally:
            front.stop()


async def test_only_a_client_whose_request_was_answered_is_kept() -> None:
    """A client whose request was cancelled or failed is closed, never handed to the next
    job: httpcore 1.0.9 can keep a connection cancelled while opening in its pool for good
    (encode/httpcore#1093), which held every later job on that client until the timeout
    (found by the front-capacity soak: sessions stuck with their finals in flight)."""
    from qwen3_asr_server.engines.remote.clients import ClientShelf

    shelf = ClientShelf(httpx.Timeout(5), {})
    url = "http://127.0.0.1:1/v1"
    first = shelf.take(url)
    shelf.put_back(url, first, answered=True)
    assert shelf.take(url) is first  # kept: its connection stays warm
    shelf.put_back(url, first, answered=False)  # cancelled or failed
    second = shelf.take(url)
    assert second is not first
    for _ in range(500):  # the close runs as a task on this loop
        if first.is_closed:
            break
        await asyncio.sleep(0.01)
    assert first.is_closed and not second.is_closed
    await shelf.aclose()
    assert second.is_closed
