"""How many live streams one front holds (issue 34): a front with `ENGINE=remote` against a
stand-in backend that answers after a fixed delay (its own process, so its CPU is not the
front's), and N `/ws/transcribe` streams replaying real speech at real-time pace from a load
generator in a third process.

    .venv/bin/python bench/front_capacity.py [--streams 10,25,50,100,200] [--seconds 30]
        [--delay 0.12]

Per N, over a window after a warm-up:
- the front's CPU seconds per stream-second (utime + stime from /proc);
- partials per stream-second, and finals' latency after the end of speech (p50/p95) minus
  the backend's delay (the VAD's end silence is in it);
- event-loop lag: the slowest `/health` answer, polled every 0.5 s;
- the front's RSS per stream;
- the load generator's own lag (how late its sends were): past 50 ms the numbers are not
  the front's.
N is past the goal when the final p95 (minus the delay, the VAD end silence of 500 ms in it) is
over 0.6 s or `/health` over 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from common import ROOT, pct

import httpx
import numpy as np

from proc import ServerProcess
from server import free_port
from streaming_client import load, pcm16

CHUNK_S = 0.1  # the load generator sends 100 ms frames
CLIP = "three_sentences.wav"
PAUSE_S = 2.0  # silence after each replay of the clip
GOAL_FINAL_S = 0.6  # final p95 after the end of speech, beyond the delay (end silence in it)


def speech_ends(samples: np.ndarray, rate: int = 16000) -> list[float]:
    """Where speech ends in the clip (seconds): a loud 32 ms frame followed by >= 0.3 s
    of quiet frames."""
    frame = 512
    loud = [
        float(np.abs(samples[i : i + frame]).max()) > 0.02 for i in range(0, len(samples), frame)
    ]
    ends, quiet = [], 0
    for i, is_loud in enumerate(loud):
        quiet = 0 if is_loud else quiet + 1
        if quiet == int(0.3 * rate / frame) and i >= quiet:
            ends.append((i - quiet + 1) * frame / rate)
    if loud and loud[-1]:
        ends.append(len(samples) / rate)
    return ends


# -- the load generator (its own process) ------------------------------------------------------
async def one_stream(url: str, seconds: float, index: int, out: dict[str, list[float]]) -> None:
    from websockets.asyncio.client import connect

    clip = load(CLIP)
    audio = np.concatenate([clip, np.zeros(int(PAUSE_S * 16000), np.float32)])
    ends = speech_ends(clip)
    chunk = int(CHUNK_S * 16000)
    async with connect(url + "/ws/transcribe?sample_rate=16000", max_size=None) as ws:
        await ws.recv()  # connected
        spoken_end: list[float] = []  # wall times at which a speech end was sent

        async def reader() -> None:
            async for raw in ws:
                event = json.loads(raw)
                now = time.perf_counter()
                if event.get("is_final"):
                    if event.get("text") and spoken_end:
                        out["finals"].append(now - spoken_end[-1])
                elif event.get("is_partial"):
                    out["partials"].append(now)

        task = asyncio.create_task(reader())
        await asyncio.sleep(index * 0.013 % CHUNK_S)  # spread the streams over a frame
        started = time.perf_counter()
        sent = 0
        while time.perf_counter() - started < seconds:
            pos = (sent * chunk) % len(audio)
            await ws.send(pcm16(audio[pos : pos + chunk]))
            sent += 1
            at = (pos + chunk) / 16000
            if any(at - CHUNK_S < end <= at for end in ends):
                spoken_end.append(time.perf_counter())
            due = started + sent * CHUNK_S
            late = time.perf_counter() - due
            out["late"].append(max(0.0, late))
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
        await asyncio.sleep(2.0)  # the last finals
        task.cancel()


async def generate(url: str, streams: int, seconds: float) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"finals": [], "partials": [], "late": []}
    ws_url = url.replace("http://", "ws://")
    await asyncio.gather(*(one_stream(ws_url, seconds, i, out) for i in range(streams)))
    return out


# -- the measurement ---------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure(front: ServerProcess, streams: int, seconds: float, delay: float) -> dict[str, float]:
    pid = front.proc.pid
    rss_before = rss_mb(pid)
    health: list[float] = []
    stop = threading.Event()

    def poll_health() -> None:
        with httpx.Client(timeout=10) as client:
            while not stop.is_set():
                started = time.perf_counter()
                client.get(front.url + "/health")
                health.append(time.perf_counter() - started)
                stop.wait(0.5)

    load = subprocess.Popen(
        [sys.executable, __file__, "--load", front.url, str(streams), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(min(5.0, seconds / 4))  # warm-up: every stream open and talking
    poller = threading.Thread(target=poll_health, daemon=True)
    poller.start()
    cpu0, t0 = cpu_seconds(pid), time.perf_counter()
    window = seconds - min(5.0, seconds / 4)
    time.sleep(max(1.0, window - 1.0))
    cpu1, t1 = cpu_seconds(pid), time.perf_counter()
    rss = rss_mb(pid)
    stop.set()
    out, _ = load.communicate(timeout=seconds + 120)
    got = json.loads(out.strip().splitlines()[-1])
    finals = [f - delay for f in got["finals"]] or [float("nan")]
    return {
        "cpu_per_stream_s": (cpu1 - cpu0) / ((t1 - t0) * streams),
        "partials_per_stream_s": len(got["partials"]) / (streams * seconds),
        "final_p50": pct(finals, 50),
        "final_p95": pct(finals, 95),
        "finals": len(got["finals"]),
        "health_max_ms": max(health or [0.0]) * 1000,
        "rss_per_stream_mb": (rss - rss_before) / streams,
        "rss_mb": rss,
        "load_lag_p99_ms": pct(got["late"] or [0.0], 99) * 1000,
    }


def main() -> None:
    if sys.argv[1:2] == ["--load"]:
        url, streams, seconds = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
        print(json.dumps(asyncio.run(generate(url, streams, seconds))))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", default="10,25,50,100,200")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--delay", type=float, default=0.12, help="the backend's answer time")
    args = parser.parse_args()
    port = free_port()
    backend = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "vllm_standin.py"), str(port), "--delay",
         str(args.delay)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    front = ServerProcess(
        {
            "ENGINE": "remote",
            "REMOTE_BACKENDS": f"http://127.0.0.1:{port}/v1",
            "REMOTE_MAX_INFLIGHT": "256",
            "MAX_QUEUE": "4096",
            "WS_MAX_SESSIONS": "1000",
            "LOG_LEVEL": "ERROR",
            "PRELOAD": "true",  # probing the backends starts with the load
            "IDLE_TIMEOUT": "0",
            "REMOTE_PROBE_INTERVAL": "1",
        }
    )
    try:
        front.wait_healthy(60)
        deadline = time.monotonic() + 30
        while httpx.get(front.url + "/health").json().get("backends_up") != 1:
            if time.monotonic() > deadline:
                raise SystemExit("the stand-in backend never came up")
            time.sleep(0.2)
        print(f"front {front.url}, stand-in delay {args.delay * 1000:.0f} ms, {args.seconds:g} s")
        print("streams | CPU s/stream-s | streams/core | partials/stream-s | final p50/p95 "
              "(minus delay) | /health max | RSS/stream | load lag p99")  # fmt: skip
        for n in (int(v) for v in args.streams.split(",")):
            m = measure(front, n, args.seconds, args.delay)
            fails = m["final_p95"] > GOAL_FINAL_S or m["health_max_ms"] > 100
            print(
                f"{n:7d} | {m['cpu_per_stream_s']:.4f} | {1 / m['cpu_per_stream_s']:.0f} | "
                f"{m['partials_per_stream_s']:.2f} | {m['final_p50']:.2f}/{m['final_p95']:.2f} s "
                f"({m['finals']} finals) | {m['health_max_ms']:.0f} ms | "
                f"{m['rss_per_stream_mb']:.2f} MB | {m['load_lag_p99_ms']:.0f} ms"
                + ("  <- past the goal" if fails else ""),
                flush=True,
            )
    finally:
        front.stop()
        backend.terminate()
        backend.wait(10)


if __name__ == "__main__":
    main()
