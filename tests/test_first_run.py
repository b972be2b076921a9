"""First run just works (issue 33): the model is fetched in the background from a stand-in
hub on loopback (HF_ENDPOINT) with progress in /health, /metrics and the log, requests get a
503 `model_downloading` meanwhile, a broken download is shown and retried; offline with
nothing cached and no MODEL_ID the bundled model serves, loudly; an explicit MODEL_ID never
falls back. Real server processes; every wait polls /health against a deadline."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import speech
from hub_standin import StandinHub
from proc import ServerProcess
from server import free_port

REPO = "test-org/tiny-qwen3-asr"
DEFAULT = "Qwen/Qwen3-ASR-0.6B"
ROOT = Path(__file__).resolve().parent.parent
DEADLINE_S = 120.0


def fresh_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """An empty HF cache of the test's own, and nothing that points at a model."""
    home = tmp_path / "hf"
    return {
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "IDLE_TIMEOUT": "0",
        "DEVICE": "cpu",
        "LOG_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


@pytest.fixture
def start() -> Iterator[Callable[..., ServerProcess]]:
    started: list[ServerProcess] = []

    def run(env: dict[str, str], cwd: Path) -> ServerProcess:
        server = ServerProcess(env, cwd=cwd)  # (its log is read as it comes)
        started.append(server)
        server.wait_healthy(timeout=DEADLINE_S)
        return server

    yield run
    for server in started:
        server.stop()


def health(server: ServerProcess) -> dict[str, Any]:
    return dict(httpx.get(server.url + "/health", timeout=10).json())


def wait_for(server: ServerProcess, what: str, test: Callable[[dict[str, Any]], bool]) -> dict:  # type: ignore[type-arg]
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        seen = health(server)
        if test(seen):
            return seen
        if server.proc.poll() is not None:
            raise AssertionError(f"server exited while waiting for {what}: {server.output()}")
        time.sleep(0.1)
    raise AssertionError(f"no {what} within {DEADLINE_S} s: {health(server)}")


def transcribe(server: ServerProcess, clip: str = "sentence_01.wav") -> httpx.Response:
    files = {"file": (clip, speech.path(clip).read_bytes())}
    return httpx.post(server.url + "/v1/audio/transcriptions", files=files, timeout=DEADLINE_S)


# -- the background download -------------------------------------------------------------------
@pytest.mark.slow
def test_download_in_the_background_with_progress_then_preload_and_serve(
    tiny_qwen_dir: Path, tmp_path: Path, start: Callable[..., ServerProcess]
) -> None:
    with StandinHub(REPO, tiny_qwen_dir) as hub:
        hub.hold_at = len(hub.files[hub.largest]) // 2  # the transfer waits there for release()
        env = fresh_env(tmp_path, HF_ENDPOINT=hub.url, MODEL_ID=REPO, MAX_NEW_TOKENS="8",
                        PRELOAD="true")  # fmt: skip
        server = start(env, tmp_path)
        seen = wait_for(server, "progress", lambda h: (h["download"] or {}).get("bytes_done", 0) > 0
                        and h["download"]["state"] == "downloading")  # fmt: skip
        download = seen["download"]
        assert download["bytes_total"] == hub.total_bytes
        assert 0 < download["bytes_done"] < hub.total_bytes
        assert "eta_s" in download and download["models"] == [REPO]
        assert seen["model_loaded"] is False and seen["fallback"] is None

        refused = transcribe(server)  # never waits on the download
        assert refused.status_code == 503, refused.text
        error = refused.json()["error"]
        assert error["code"] == "model_downloading"
        assert re.search(r"downloading: \d+% done", error["message"]), error["message"]
        assert int(refused.headers["Retry-After"]) >= 1
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
        assert f"asr_model_download_total_bytes {float(hub.total_bytes)}" in metrics
        assert "asr_model_fallback 0.0" in metrics

        hub.release()
        wait_for(server, "the preload after the download", lambda h: h["model_loaded"])
        done = health(server)["download"]
        assert done["state"] == "done" and done["bytes_done"] == hub.total_bytes
        served = transcribe(server)
        assert served.status_code == 200, served.text
        assert served.headers["X-Model-ID"] == REPO
    log = server.output()
    assert f"downloading {REPO}: " in log and "% (" in log  # progress lines, not a tqdm bar
    assert f"download of {REPO} complete" in log


@pytest.mark.slow
def test_a_download_that_breaks_midway_is_shown_retried_and_then_served(
    tiny_qwen_dir: Path, tmp_path: Path, start: Callable[..., ServerProcess]
) -> None:
    with StandinHub(REPO, tiny_qwen_dir) as hub:
        hub.break_at = len(hub.files[hub.largest]) // 2  # then the hub is down until restore()
        env = fresh_env(tmp_path, HF_ENDPOINT=hub.url, MODEL_ID=REPO, MAX_NEW_TOKENS="8")
        server = start(env, tmp_path)
        failed = wait_for(server, "the failure", lambda h: (h["download"] or {}).get("error"))
        download = failed["download"]
        assert download["state"] == "failed" and download["failures"] >= 1
        assert download["retry_in_s"] >= 0
        refused = transcribe(server)
        assert refused.status_code == 503, refused.text
        message = refused.json()["error"]["message"]
        assert "download failed" in message and "tries again in" in message, message
        assert "Traceback" not in message and len(message) < 400

        hub.restore()
        wait_for(server, "the retried download", lambda h: h["download"]["state"] == "done")
        served = transcribe(server)
        assert served.status_code == 200, served.text
    log = server.output()
    assert f"download of {REPO} failed at" in log and "retrying in" in log


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_stopping_during_a_download_does_not_wait_for_the_transfer(
    tiny_qwen_dir: Path, tmp_path: Path, start: Callable[..., ServerProcess], sig: int
) -> None:
    """Ctrl-C while a multi-GB file is coming: the process exits now (the file stays
    `.incomplete` and resumes later), not when the file is done."""
    with StandinHub(REPO, tiny_qwen_dir) as hub:
        hub.hold_at = len(hub.files[hub.largest]) // 2  # held until release(): never, here
        env = fresh_env(tmp_path, HF_ENDPOINT=hub.url, MODEL_ID=REPO)
        server = start(env, tmp_path)
        wait_for(server, "a held transfer", lambda h: (h["download"] or {}).get("bytes_done", 0)
                 > 0 and h["download"]["state"] == "downloading")  # fmt: skip
        server.proc.send_signal(sig)
        try:
            code = server.proc.wait(DEADLINE_S / 4)  # a generous bound: the transfer never ends
        finally:
            hub.release()
        assert code is not None
    assert "Application shutdown complete" in server.output()


# -- offline: the announced fallback and the explicit model ------------------------------------
@pytest.mark.slow
def test_offline_with_nothing_cached_the_default_falls_back_to_the_bundled_model_loudly(
    tmp_path: Path, start: Callable[..., ServerProcess]
) -> None:
    server = start(fresh_env(tmp_path, HF_HUB_OFFLINE="1"), tmp_path)
    seen = health(server)
    assert seen["model_id"] == "whisper-tiny.en" and seen["engine"] == "whisper"
    fallback = seen["fallback"]
    assert fallback["wanted"] == "Qwen/Qwen3-ASR-0.6B"
    assert "HF_HUB_OFFLINE" in fallback["reason"] and seen["download"] is None
    models = httpx.get(server.url + "/v1/models", timeout=10).json()["data"]
    assert models[0]["id"] == "whisper-tiny.en" and models[0]["fallback"] == fallback
    r = transcribe(server)
    assert r.status_code == 200, r.text
    assert "quick" in r.json()["text"].lower()
    assert r.headers["X-Model-ID"] == "whisper-tiny.en"
    files = {"file": ("a.wav", speech.path("sentence_01.wav").read_bytes())}
    routes = [
        ("/v1/audio/transcriptions", {"stream": "true"}),  # SSE
        ("/v1/audio/transcriptions/stream", {}),
        ("/v1/audio/subtitles", {}),
    ]
    for path, data in routes:
        answer = httpx.post(server.url + path, files=files, data=data, timeout=DEADLINE_S)
        assert answer.status_code == 200, (path, answer.text)
        assert answer.headers["X-Model-ID"] == "whisper-tiny.en", path
    assert "X-Model-ID" not in httpx.get(server.url + "/health", timeout=10).headers
    assert "asr_model_fallback 1.0" in httpx.get(server.url + "/metrics", timeout=10).text
    log = server.output()
    warning = next(line for line in log.splitlines() if "WARNING" in line and "default" in line)
    assert "Qwen/Qwen3-ASR-0.6B" in warning and "HF_HUB_OFFLINE" in warning
    assert "`qwen3-asr-server download`" in warning


@pytest.mark.slow
def test_an_unreachable_hub_also_falls_back_for_the_default(
    tmp_path: Path, start: Callable[..., ServerProcess]
) -> None:
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens: connection refused
    server = start(fresh_env(tmp_path, HF_ENDPOINT=closed), tmp_path)
    seen = health(server)
    assert seen["model_id"] == "whisper-tiny.en"
    assert "cannot reach" in seen["fallback"]["reason"], seen["fallback"]


def test_an_explicit_model_offline_never_falls_back_and_says_why_in_two_sentences(
    tmp_path: Path, start: Callable[..., ServerProcess]
) -> None:
    env = fresh_env(tmp_path, HF_HUB_OFFLINE="1", MODEL_ID="Qwen/Qwen3-ASR-0.6B")
    server = start(env, tmp_path)
    r = transcribe(server)
    assert r.status_code == 503, r.text
    error = r.json()["error"]
    assert error["code"] == "model_unavailable"
    message = error["message"]
    assert "Qwen/Qwen3-ASR-0.6B" in message and "qwen3-asr-server download" in message
    assert message.count(". ") <= 3 and "Traceback" not in message, message
    seen = health(server)
    assert seen["fallback"] is None and seen["model_id"] == "Qwen/Qwen3-ASR-0.6B"
    assert not server.torch_loaded()  # refused before any import of torch


# -- the README's quick start, as a new user tries it ------------------------------------------
def readme_curl() -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"^curl -s http://127\.0\.0\.1:8100/v1/audio/transcriptions.*$", text, re.M)
    assert match, "the README's quick start has no curl line"
    return match.group(0)


@pytest.mark.slow
def test_the_readme_quick_start_curl_returns_text_offline_with_an_empty_cache(
    tmp_path: Path, start: Callable[..., ServerProcess]
) -> None:
    """`make run` is `python -m qwen3_asr_server` in the checkout; here in an empty directory
    (no .env), offline, with an empty HF cache and no MODEL_ID."""
    server = start(fresh_env(tmp_path, HF_HUB_OFFLINE="1"), tmp_path)
    (tmp_path / "speech.wav").write_bytes(speech.path("sentence_01.wav").read_bytes())
    command = readme_curl().replace("127.0.0.1:8100", f"127.0.0.1:{server.port}")
    done = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True,
                          timeout=DEADLINE_S)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "quick" in done.stdout.lower(), done.stdout


def cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "qwen3_asr_server", *args]
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=DEADLINE_S)  # fmt: skip


# -- `download` with no argument, then the offline server -------------------------------------
@pytest.mark.slow
def test_download_without_an_argument_fetches_the_default_which_then_serves_offline(
    tiny_qwen_dir: Path, tmp_path: Path, start: Callable[..., ServerProcess]
) -> None:
    """The stand-in hub serves the tiny checkpoint as the default repo id: `download` fetches
    it, `check` says it serves it, and an offline server with no MODEL_ID serves it (no
    fallback)."""
    with StandinHub(DEFAULT, tiny_qwen_dir) as hub:
        env = {**os.environ, **fresh_env(tmp_path, HF_ENDPOINT=hub.url)}
        env.pop("MODEL_ID", None)
        done = cli("download", env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"MODEL_ID is unset: fetching the default model {DEFAULT}" in done.stdout
        assert f"{DEFAULT}: downloaded to" in done.stdout
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    checked = cli("check", env=offline, cwd=tmp_path)
    assert f"ok      `make run` serves {DEFAULT} (MODEL_ID is unset" in checked.stdout, (
        checked.stdout
    )
    server = start(fresh_env(tmp_path, HF_HUB_OFFLINE="1", MAX_NEW_TOKENS="8"), tmp_path)
    seen = health(server)
    assert seen["model_id"] == DEFAULT and seen["fallback"] is None and seen["download"] is None
    r = transcribe(server)
    assert r.status_code == 200, r.text
    assert r.headers["X-Model-ID"] == DEFAULT


def test_check_names_the_fallback_offline(tmp_path: Path) -> None:
    env = {**os.environ, **fresh_env(tmp_path, HF_HUB_OFFLINE="1")}
    env.pop("MODEL_ID", None)
    done = cli("check", env=env, cwd=tmp_path)
    assert done.returncode == 1
    assert "model whisper-tiny.en on the whisper engine" in done.stdout
    assert f"PROBLEM `make run` would serve the bundled whisper-tiny.en instead of {DEFAULT}" in (
        done.stdout
    )
    assert "-> run `qwen3-asr-server download` with internet access" in done.stdout


def test_a_library_error_becomes_two_sentences_with_the_fix(tmp_path: Path) -> None:
    """The 503 for a load that failed inside a library: what is wrong and the command that
    fixes it, never the library's exception text (that goes to the log)."""
    from qwen3_asr_server.errors import ModelLoadError
    from qwen3_asr_server.models.plan import short_load_error

    def failed(message: str, cause: Exception) -> ModelLoadError:
        error = ModelLoadError(message)
        error.__cause__ = cause
        return error

    noise = OSError("We couldn't connect to 'https://huggingface.co' to load this file ... " * 5)
    hub = short_load_error(
        "org/missing", failed("Could not load 'org/missing' (MODEL_ID: x)", noise)
    )
    assert hub.startswith("MODEL_ID='org/missing' is not in the HF cache")
    assert hub.endswith("Run `qwen3-asr-server download org/missing`.") and len(hub) < 400
    nowhere = short_load_error("./nope", failed("Could not load './nope' (MODEL_ID: x)", noise))
    assert "neither a directory on this machine nor a Hugging Face repo id" in nowhere
    aligner = failed("Could not load 'org/aligner' (FORCED_ALIGNER_ID: x)", noise)
    assert short_load_error("org/model", aligner).startswith("FORCED_ALIGNER_ID='org/aligner'")
    (tmp_path / "config.json").write_text("{}")
    broken = short_load_error(str(tmp_path), failed("bad", RuntimeError("size mismatch " * 50)))
    assert "RuntimeError; the server log has the details" in broken and len(broken) < 300
    plain = ModelLoadError("Ours already says what to do.")
    assert short_load_error("x", plain) == "Ours already says what to do."


def test_check_asks_the_hub_about_an_explicit_model_it_would_fetch(
    tiny_qwen_dir: Path, tmp_path: Path
) -> None:
    """issue 41: `check` said "ready to serve" for an uncached MODEL_ID that is a typo (or
    with the hub out of reach); the server then answered 503 to every request."""
    with StandinHub(REPO, tiny_qwen_dir) as hub:
        env = {**os.environ, **fresh_env(tmp_path, HF_ENDPOINT=hub.url)}
        typo = cli("check", "--model", REPO + "-typo", env=env, cwd=tmp_path)
        assert typo.returncode == 1, typo.stdout
        assert f"PROBLEM model {REPO}-typo: not in the HF cache, and it cannot be" in typo.stdout
        good = cli("check", "--model", REPO, env=env, cwd=tmp_path)
        assert good.returncode == 0, good.stdout
        assert f"model {REPO}: not cached yet; the server downloads it" in good.stdout
    closed = f"http://127.0.0.1:{free_port()}"
    env = {**os.environ, **fresh_env(tmp_path, HF_ENDPOINT=closed)}
    down = cli("check", "--model", REPO, env=env, cwd=tmp_path)
    assert down.returncode == 1 and f"PROBLEM model {REPO}: not in the HF cache" in down.stdout
