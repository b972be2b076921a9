"""ENGINE=remote (issue 14): throughput and latency with 1, 2 and 3 backends, and the front's
own overhead per job. Real processes on loopback; the backends are instances of this server
with the bundled whisper model (CPU_THREADS=1 each).

    .venv/bin/python bench/scale.py [--requests 36]

On a 2-core machine three CPU backends share two cores, so this shows the dispatcher and
the overhead, not GPU scaling: with one GPU per backend each adds its own throughput.

- direct: the clips sent straight to one backend, one at a time (reference latency);
- overhead: (front, one backend, one at a time) minus direct, per request (p50): decoding
  in the front, the 16-bit WAV sent on, the extra HTTP hop. Measured twice: against a
  whisper backend (the difference drowns in whisper's own ±100 ms), and against
  tests/vllm_standin.py, which answers at once, so front minus direct is the front's cost;
- throughput: `--requests` clips from 3 x backends concurrent clients, audio seconds per
  wall second and p95 latency; and one 2-minute upload's total time.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from common import ROOT, parse_server_timing, pct

import httpx
import soundfile as sf

import speech
from proc import WHISPER_BACKEND_ENV, ServerProcess
from server import free_port


def clips() -> list[tuple[bytes, float]]:
    out = []
    for name in sorted(speech.sentences()):
        path = speech.path(name)
        out.append((path.read_bytes(), sf.info(str(path)).duration))
    return out


CLIENT = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=32))


def post(url: str, data: bytes) -> tuple[float, dict[str, float]]:
    started = time.perf_counter()
    r = CLIENT.post(url + "/v1/audio/transcriptions", files={"file": ("a.wav", data)})
    r.raise_for_status()
    return time.perf_counter() - started, parse_server_timing(r.headers.get("server-timing", ""))


def front(backends: list[ServerProcess], inflight: int) -> ServerProcess:
    env = {
        "ENGINE": "remote",
        "REMOTE_BACKENDS": ",".join(b.url + "/v1" for b in backends),
        "REMOTE_MAX_INFLIGHT": str(inflight),
        "IDLE_TIMEOUT": "0",
        "PRELOAD": "true",
        "LOG_LEVEL": "WARNING",
    }
    server = ServerProcess(env)
    server.wait_healthy()
    deadline = time.monotonic() + 30
    while httpx.get(server.url + "/health").json().get("backends_up") != len(backends):
        if time.monotonic() > deadline:
            raise TimeoutError("backends not up")
        time.sleep(0.1)
    return server


def overhead(backend: ServerProcess, data: list[tuple[bytes, float]]) -> None:
    server = front([backend], 1)
    try:
        for url in (backend.url, server.url):  # warm both
            post(url, data[0][0])
        direct, via, inside = [], [], []
        for _ in range(3):
            for clip, _seconds in data:  # interleaved: direct, then through the front
                direct.append(post(backend.url, clip)[0])
                total, timing = post(server.url, clip)
                via.append(total)
                inside.append(timing["decode"] + timing["queue"])  # the front's own share
        diffs = [v - d for v, d in zip(via, direct, strict=True)]
        print(
            f"overhead, {len(direct)} clips one at a time: direct p50 "
            f"{statistics.median(direct) * 1000:.1f} ms, via front "
            f"{statistics.median(via) * 1000:.1f} ms, difference p50 "
            f"{statistics.median(diffs) * 1000:.1f} ms; front's own time per job (decode, "
            f"queue, WAV encode: Server-Timing) p50 {statistics.median(inside) * 1000:.1f} ms, "
            f"p95 {pct(inside, 95) * 1000:.1f} ms"
        )
    finally:
        server.stop()


def standin_overhead(data: list[tuple[bytes, float]]) -> None:
    port = free_port()
    script = ROOT / "tests" / "vllm_standin.py"
    proc = subprocess.Popen([sys.executable, str(script), str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if CLIENT.get(url + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.1)
        server = ServerProcess(
            {"ENGINE": "remote", "REMOTE_BACKENDS": url + "/v1", "LOG_LEVEL": "WARNING"}
        )
        try:
            server.wait_healthy()
            for target in (url, server.url, url, server.url):  # warm both
                CLIENT.post(
                    target + "/v1/audio/transcriptions", files={"file": ("a.wav", data[0][0])}
                )
            direct, via = [], []
            for _ in range(5):
                for clip, _seconds in data:
                    direct.append(post_plain(url, clip))
                    via.append(post_plain(server.url, clip))
            diffs = [v - d for v, d in zip(via, direct, strict=True)]
            print(
                f"overhead against an instant backend (vLLM stand-in), {len(direct)} clips of "
                f"3-5 s: direct p50 {statistics.median(direct) * 1000:.1f} ms, via front p50 "
                f"{statistics.median(via) * 1000:.1f} ms, front's cost per job p50 "
                f"{statistics.median(diffs) * 1000:.1f} ms, p95 {pct(diffs, 95) * 1000:.1f} ms"
            )
        finally:
            server.stop()
    finally:
        proc.terminate()
        proc.wait(10)


def post_plain(url: str, data: bytes) -> float:
    started = time.perf_counter()
    r = CLIENT.post(url + "/v1/audio/transcriptions", files={"file": ("a.wav", data)})
    r.raise_for_status()
    return time.perf_counter() - started


def throughput(backends: list[ServerProcess], data: list[tuple[bytes, float]], n: int) -> None:
    server = front(backends, 1)
    try:
        post(server.url, data[0][0])
        jobs = [data[i % len(data)] for i in range(n)]
        started = time.perf_counter()
        with ThreadPoolExecutor(3 * len(backends)) as pool:
            latencies = [r[0] for r in pool.map(lambda j: post(server.url, j[0]), jobs)]
        wall = time.perf_counter() - started
        audio = sum(seconds for _, seconds in jobs)
        long_clip = speech.path("long_2min.wav").read_bytes()
        long_total, _ = post(server.url, long_clip)
        print(
            f"{len(backends)} backend(s): {n} clips ({audio:.0f} s audio) in {wall:.1f} s = "
            f"{audio / wall:.1f} audio s/s, latency p50 {pct(latencies, 50):.2f} s, "
            f"p95 {pct(latencies, 95):.2f} s; 2-minute upload {long_total:.2f} s"
        )
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=36)
    args = parser.parse_args()
    data = clips()
    standin_overhead(data)
    backends = [ServerProcess(WHISPER_BACKEND_ENV) for _ in range(3)]
    try:
        for b in backends:
            b.wait_healthy(60)
        overhead(backends[0], data)
        for count in (1, 2, 3):
            throughput(backends[:count], data, args.requests)
    finally:
        for b in backends:
            b.stop()


if __name__ == "__main__":
    main()
