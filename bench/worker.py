"""Inline against worker process (issue 11), real `python -m qwen3_asr_server`, tiny Qwen.

    .venv/bin/python bench/worker.py

Reports for ENGINE_PROCESS=inline and =worker: RSS after the idle unload, the latency of
the first request after an unload (reload), the per-job overhead of a 30 s segment (end to
end minus the engine's own time from Server-Timing) and a short clip's end-to-end latency.
"""

from __future__ import annotations

import statistics
import time

from common import parse_server_timing, tiny_qwen

import httpx
import numpy as np

from audio_files import encode
from proc import ServerProcess


def wav(seconds: float) -> bytes:
    rng = np.random.default_rng(0)
    return encode(
        (rng.standard_normal(int(seconds * 16000)) * 0.1).astype(np.float32), 16000, "WAV"
    )


def post(url: str, data: bytes) -> tuple[float, dict[str, float]]:
    started = time.perf_counter()
    r = httpx.post(url + "/v1/audio/transcriptions", files={"file": ("a.wav", data)}, timeout=300)
    r.raise_for_status()
    return time.perf_counter() - started, parse_server_timing(r.headers["server-timing"])


def measure(mode: str, model: str) -> dict[str, float]:
    env = {
        "MODEL_ID": model,
        "MAX_NEW_TOKENS": "8",
        "ENGINE_PROCESS": mode,
        "IDLE_TIMEOUT": "3",
        "LOG_LEVEL": "WARNING",
    }
    server = ServerProcess(env)
    try:
        server.wait_healthy()
        cold, _ = post(server.url, wav(1))
        short = [post(server.url, wav(1))[0] for _ in range(20)]
        overhead = []
        for _ in range(10):
            total, timing = post(server.url, wav(30))
            overhead.append(total - timing["engine"] - timing["decode"])
        deadline = time.monotonic() + 30
        while httpx.get(server.url + "/health").json()["model_loaded"]:
            if time.monotonic() > deadline:
                raise TimeoutError("no idle unload")
            time.sleep(0.2)
        time.sleep(1)
        rss = server.rss_mb()
        reload, _ = post(server.url, wav(1))
        return {
            "first request": cold,
            "short clip p50": statistics.median(short),
            "30 s job overhead p50": statistics.median(overhead),
            "RSS after idle unload MB": rss,
            "reload (first request after unload)": reload,
        }
    finally:
        server.stop()


def main() -> None:
    model = str(tiny_qwen())
    results = {mode: measure(mode, model) for mode in ("inline", "worker")}
    for key in results["inline"]:
        a, b = results["inline"][key], results["worker"][key]
        unit = "" if "MB" in key else " s"
        print(f"{key}: inline {a:.3f}{unit}, worker {b:.3f}{unit}")


if __name__ == "__main__":
    main()
