"""Start `python -m qwen3_asr_server` as a real process and look inside it via /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from server import free_port

# A backend for ENGINE=remote tests and bench/scale.py: the bundled whisper model, loaded at
# start, one CPU thread (several share this machine's cores).
WHISPER_BACKEND_ENV = {
    "MODEL_ID": "whisper-tiny.en",
    "IDLE_TIMEOUT": "0",
    "PRELOAD": "true",
    "DIARIZE_PRELOAD": "false",  # a backend never diarizes (its front does)
    "CPU_THREADS": "1",
    "LOG_LEVEL": "WARNING",
}


class ServerProcess:
    def __init__(
        self,
        env: dict[str, str],
        cwd: Path | None = None,
        port: int | None = None,
        preexec_fn: Callable[[], None] | None = None,
    ):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = {**os.environ, "PORT": str(self.port), "HOST": "127.0.0.1", **env}
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "qwen3_asr_server"],
            env=full_env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=preexec_fn,  # e.g. a resource limit for the server only
        )
        # Read as it comes: a full pipe would block the server on its next log line (its
        # inference thread and its event loop both log).
        self.lines: list[str] = []
        self._seen = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._seen:
                self.lines.append(line)
                self._seen.notify_all()

    def wait_for(self, text: str, timeout: float) -> str | None:
        """The first output line holding `text`, waiting up to `timeout` s (None: none)."""
        with self._seen:
            self._seen.wait_for(lambda: any(text in line for line in self.lines), timeout)
            return next((line for line in self.lines if text in line), None)

    def wait_healthy(self, timeout: float = 120.0) -> float:
        """Seconds from process start to the first 200 on /health."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return time.perf_counter() - self.started
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
        raise TimeoutError("server did not become healthy")

    def maps(self) -> str:
        return Path(f"/proc/{self.proc.pid}/maps").read_text()

    def torch_loaded(self) -> bool:
        return "libtorch" in self.maps()

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def output(self) -> str:
        self.stop()
        self._reader.join(30)
        return "".join(self.lines)
