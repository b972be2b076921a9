"""`make e2e`: start a local server with the bundled offline model, run the black-box suite
(E2Etest/) against it, stop the server whatever happens, exit with pytest's status.

The server is `python -m qwen3_asr_server` on a free loopback port with MODEL_ID=whisper-tiny.en
and a random API_KEY (so the auth tests run too), started in an empty directory so that a
developer's `.env` does not change what is tested. A stand-in OpenAI-compatible chat endpoint
(this process, stdlib only) answers the translation calls by returning the text unchanged, so
/v1/audio/translations is exercised end to end instead of answering 501.

    python scripts/run_e2e.py [--no-api-key] [--no-translate] [pytest args...]

Anything not recognised is passed to pytest (e.g. `-m smoke`, `-k realtime`, `-x`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT = 180.0  # import + first /health on a busy 2-core machine
LOAD_TIMEOUT = 180.0  # PRELOAD: the model is loaded before the tests start
STOP_TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EchoChat(BaseHTTPRequestHandler):
    """POST /v1/chat/completions: the user message back (an identity "translation": the test
    speech is English and the default target is English). A JSON array stays a JSON array of
    the same length, as the server asks for subtitle cues."""

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if not self.path.endswith("/chat/completions"):
            self.send_error(404)
            return
        content = body["messages"][-1]["content"]
        reply = {
            "id": "chatcmpl-e2e",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "echo"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def echo_llm() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), EchoChat)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def get_health(url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as response:
            return dict(json.loads(response.read()))
    except (OSError, ValueError):
        return None


def wait_ready(url: str, proc: subprocess.Popen[bytes], loaded: bool = True) -> bool:
    """/health answers, then (PRELOAD, `loaded`) the model is loaded. False if the server
    died or never answered."""
    deadline = time.monotonic() + START_TIMEOUT
    while (health := get_health(url)) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.25)
    print(f"run_e2e: server up at {url}: {health.get('engine')} {health.get('model_id')}")
    if not loaded:
        return True
    deadline = time.monotonic() + LOAD_TIMEOUT
    while not (health or {}).get("model_loaded"):
        if proc.poll() is not None:
            return False
        if time.monotonic() > deadline or (health or {}).get("last_load_error"):
            print(f"run_e2e: model not loaded ({health}); the tests will load it")
            break
        time.sleep(0.5)
        health = get_health(url)
    return True


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the server finishes open sessions and exits); SIGKILL to its process group
    (the server and anything it started) if it has not exited in time."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        print("run_e2e: the server did not stop in time; killing it")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own group (start_new_session)
        proc.wait()


def tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def readme_curl() -> str:
    """The README's quick-start curl command (the first one)."""
    text = (REPO / "README.md").read_text()
    return next(line for line in text.splitlines() if line.startswith("curl "))


def new_user(workdir: Path) -> int:
    """A fresh clone, tried as a new user would, offline: `make run` (no MODEL_ID, an empty
    HF cache, no hub), then the README's curl. The default model cannot be had, so the
    bundled one serves, announced; the curl must return text. 0 when it does."""
    clone = workdir / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    port = free_port()
    venv = REPO / ".venv"  # installed already (make install-dev): not installed twice
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_ID", "API_KEY", "PRELOAD")}
    # the clone's own code, not the editable install's (the venv points at REPO/src)
    env |= {"PORT": str(port), "HF_HOME": str(workdir / "hf"), "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(clone / "src")}  # fmt: skip
    env.pop("HF_HUB_CACHE", None)
    url = f"http://127.0.0.1:{port}"
    log_path = workdir / "new-user.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            ["make", "-o", f"{venv}/.installed", "run", f"VENV={venv}"],
            cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            if not wait_ready(url, proc, loaded=False):
                print(f"run_e2e: `make run` did not come up:\n{tail(log_path)}")
                return 1
            shutil.copy(REPO / "tests/data/speech/sentence_01.wav", workdir / "speech.wav")
            command = readme_curl().replace("127.0.0.1:8100", f"127.0.0.1:{port}")
            print(f"run_e2e: new user: {command}")
            try:
                done = subprocess.run(
                    ["bash", "-c", command], cwd=workdir, capture_output=True, text=True,
                    timeout=300,
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                print(f"run_e2e: the README's curl got no answer in 300 s:\n{tail(log_path)}")
                return 1
            health = get_health(url) or {}
            try:
                text = str(json.loads(done.stdout)["text"])
            except (ValueError, KeyError, TypeError):
                text = ""
            print(f"run_e2e: new user got {done.stdout.strip()[:200]!r}; served "
                  f"{health.get('model_id')}, fallback {health.get('fallback')}")  # fmt: skip
            if "quick" not in text.lower() or not health.get("fallback"):
                print(tail(log_path))
                return 1
            return 0
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-api-key", action="store_true", help="serve without API_KEY")
    parser.add_argument("--no-translate", action="store_true", help="no translation model")
    parser.add_argument(
        "--no-new-user", action="store_true", help="skip the fresh-clone `make run` + curl check"
    )
    args, pytest_args = parser.parse_known_args()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    key = None if args.no_api_key else "e2e-" + secrets.token_hex(8)
    workdir = Path(tempfile.mkdtemp(prefix="qwen3-asr-e2e-"))
    log_path = workdir / "server.log"
    started = time.monotonic()
    keep_log = False
    if not args.no_new_user:
        if new_user(workdir) != 0:
            print("run_e2e: FAILED: a fresh clone's `make run` + the README's curl, offline")
            return 1
        print("run_e2e: a fresh clone's `make run` + the README's curl, offline: text returned")
    with contextlib.ExitStack() as stack:
        env = {
            **os.environ,
            "MODEL_ID": "whisper-tiny.en",
            "HOST": "127.0.0.1",
            "PORT": str(port),
            "API_KEY": key or "",
            "PRELOAD": "true",
            "IDLE_TIMEOUT": "0",
            "LOG_LEVEL": "INFO",
            "LOG_JSON": "false",
            "PYTHONUNBUFFERED": "1",
        }
        if not args.no_translate:
            env["TRANSLATE_BASE_URL"] = stack.enter_context(echo_llm())
            env["TRANSLATE_MODEL"] = "echo"
            env["TRANSLATE_API_KEY"] = "unused"
        log = stack.enter_context(log_path.open("wb"))
        print(f"run_e2e: starting the server on {url} (log: {log_path})")
        proc = subprocess.Popen(
            [sys.executable, "-m", "qwen3_asr_server"],
            cwd=workdir,  # no .env from the repository
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            if not wait_ready(url, proc):
                print(f"run_e2e: the server did not come up (exit {proc.poll()}):")
                print(tail(log_path))
                keep_log = True
                return 2
            print(f"run_e2e: ready after {time.monotonic() - started:.1f} s; running E2Etest")
            test_env = {**os.environ, "E2E_BASE_URL": url, "E2E_API_KEY": key or ""}
            status = subprocess.call(
                [sys.executable, "-m", "pytest", str(REPO / "E2Etest"), *pytest_args],
                cwd=REPO,
                env=test_env,
            )
            if status not in (0, 5) or proc.poll() is not None:
                print(f"run_e2e: pytest exit {status}; last server log lines:")
                print(tail(log_path))
                keep_log = True
            return status
        except KeyboardInterrupt:
            keep_log = True
            return 130
        finally:
            stop(proc)
            print(f"run_e2e: server stopped; {time.monotonic() - started:.1f} s in all")
            if keep_log:
                print(f"run_e2e: server log kept in {log_path}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
