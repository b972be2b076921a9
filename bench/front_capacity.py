"""How many live streams one front holds (issue 34): fronts with `ENGINE=remote` against a
stand-in backend that answers after a fixed delay (its own process, so its CPU is not the
fronts'), and N live streams replaying real speech at real-time pace from a load generator
in a third process (`stream_load.py`).

    .venv/bin/python bench/front_capacity.py [--streams 10,25,50,100,200] [--seconds 30]
        [--delay 0.12] [--protocol ws|realtime|pcmu] [--chunk-ms 100] [--fronts 1]
        [--pin] [--call-s S] [--soak SECONDS --streams N]

Per N, over a window after a warm-up:
- the fronts' CPU seconds per stream-second (utime + stime from /proc), and what the load
  generator and the stand-in took beside them (cores);
- the streaming VAD's share of the fronts' CPU and its frames per model call (/metrics);
- partials per stream-second, and finals' latency after the end of speech (p50/p95) minus
  the backend's delay (the VAD's end silence is in it). Each final is timed from the
  latest end of speech sent: when finals lag by more than a sentence (a front far past its
  capacity) the latency is understated, so read those rows as "past the goal", not as
  numbers;
- event-loop lag: `/health` answer times, polled every 0.2 s (p99 and max);
- the fronts' RSS per stream;
- the load generator's own lag (how late its sends were): past 50 ms the numbers are not
  the fronts';
- streams dropped (closed by the server or ended by an error) and error events.
N is past the goal when the final p95 (minus the delay, the VAD end silence of 500 ms in it)
is over 0.6 s or `/health` over 100 ms. `--pin` puts the fronts on core 0 and the load
generator and the stand-in on core 1: the N at failure is then per core.

`--soak S` runs N streams for S seconds and samples the fronts' RSS every 30 s: the growth
after the first 2 minutes, sessions dropped and the latencies over the whole run. With
`--call-s C` every stream reconnects each C seconds (calls come and go: a new session each).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from common import ROOT, pct

import httpx

from proc import ServerProcess
from server import free_port

GOAL_FINAL_S = 0.6  # final p95 after the end of speech, beyond the delay (end silence in it)
LOAD = Path(__file__).with_name("stream_load.py")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class HealthPoller:
    """`/health` of every front every 0.2 s, on a thread: its answer times (a failed or
    timed-out poll counts as 10 s)."""

    def __init__(self, fronts: list[ServerProcess]) -> None:
        self.times: list[float] = []
        self._fronts = fronts
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self._stop.is_set():
                for front in self._fronts:
                    started = time.perf_counter()
                    try:
                        client.get(front.url + "/health")
                        self.times.append(time.perf_counter() - started)
                    except httpx.HTTPError:
                        self.times.append(10.0)
                self._stop.wait(0.2)

    def stop(self) -> list[float]:
        self._stop.set()
        self._thread.join(15)
        return self.times or [0.0]


def vad_counters(fronts: list[ServerProcess]) -> tuple[float, float, float]:
    """The fronts' streaming VAD so far, from /metrics: thread seconds, frames, model calls."""
    totals = [0.0, 0.0, 0.0]
    names = ("asr_vad_seconds_total", "asr_vad_frames_total", "asr_vad_calls_total")
    for front in fronts:
        for line in httpx.get(front.url + "/metrics", timeout=10).text.splitlines():
            name, _, value = line.partition(" ")
            if name in names:
                totals[names.index(name)] += float(value)
    return totals[0], totals[1], totals[2]


def pin(pid: int, cores: set[int]) -> None:
    """Every thread of `pid` to `cores` (threads it starts later inherit the mask)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task.name), cores)


def start_load(
    fronts: list[ServerProcess], streams: int, seconds: float, args: argparse.Namespace
) -> subprocess.Popen[str]:
    urls = ",".join(f.url for f in fronts)
    command = [sys.executable, str(LOAD), urls, str(streams), str(seconds), args.protocol]
    command += [str(args.chunk_ms), str(args.call_s)]
    load = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    if args.pin:
        pin(load.pid, {1})
    return load


def summary(got: dict[str, Any], streams: int, seconds: float, delay: float) -> dict[str, float]:
    finals = [f - delay for f in got["finals"]] or [float("nan")]
    return {
        "partials_per_stream_s": len(got["partials"]) / (streams * seconds),
        "final_p50": pct(finals, 50),
        "final_p95": pct(finals, 95),
        "finals": len(got["finals"]),
        "load_lag_p99_ms": pct(got["late"] or [0.0], 99) * 1000,
        "dropped": got["dropped"],
        "errors": len(got["errors"]),
    }


def measure(
    fronts: list[ServerProcess], others: dict[str, int], streams: int, args: argparse.Namespace
) -> dict[str, float]:
    seconds = args.seconds
    pids = [f.proc.pid for f in fronts]
    rss_before = sum(rss_mb(p) for p in pids)
    load = start_load(fronts, streams, seconds, args)
    others = {**others, "load": load.pid}
    time.sleep(min(5.0, seconds / 4))  # warm-up: every stream open and talking
    poller = HealthPoller(fronts)
    cpu0 = sum(cpu_seconds(p) for p in pids)
    side0 = {k: cpu_seconds(p) for k, p in others.items()}
    vad0 = vad_counters(fronts)
    t0 = time.perf_counter()
    time.sleep(max(1.0, seconds - min(5.0, seconds / 4) - 1.0))
    elapsed = time.perf_counter() - t0
    cpu = sum(cpu_seconds(p) for p in pids) - cpu0
    vad = [b - a for a, b in zip(vad0, vad_counters(fronts), strict=True)]
    side = {k: (cpu_seconds(p) - side0[k]) / elapsed for k, p in others.items()}
    rss = sum(rss_mb(p) for p in pids)
    health = poller.stop()
    out, _ = load.communicate(timeout=seconds + 180)
    got = json.loads(out.strip().splitlines()[-1])
    if got["errors"]:
        print("  first errors:", got["errors"][:3])
    return {
        **summary(got, streams, seconds, args.delay),
        "cpu_per_stream_s": cpu / (elapsed * streams),
        "vad_share": vad[0] / cpu if cpu else 0.0,
        "frames_per_call": vad[1] / vad[2] if vad[2] else 0.0,
        "front_cores": cpu / elapsed,
        "load_cores": side["load"],
        "standin_cores": side["standin"],
        "health_p99_ms": pct(health, 99) * 1000,
        "health_max_ms": max(health) * 1000,
        "rss_per_stream_mb": (rss - rss_before) / streams,
        "rss_mb": rss,
    }


def soak(fronts: list[ServerProcess], streams: int, args: argparse.Namespace) -> None:
    """N streams for args.soak seconds: RSS every 30 s, then the whole run's numbers."""
    pids = [f.proc.pid for f in fronts]
    load = start_load(fronts, streams, args.soak, args)
    poller = HealthPoller(fronts)
    started = time.perf_counter()
    cpu0 = sum(cpu_seconds(p) for p in pids)
    samples: list[tuple[float, float]] = []
    out = None
    while out is None:  # (communicate reads the load's output meanwhile: a full pipe would stop it)
        samples.append((time.perf_counter() - started, sum(rss_mb(p) for p in pids)))
        print(f"  {samples[-1][0]:6.0f} s  RSS {samples[-1][1]:7.1f} MB", flush=True)
        with contextlib.suppress(subprocess.TimeoutExpired):
            out, _ = load.communicate(timeout=30)
    cpu = sum(cpu_seconds(p) for p in pids) - cpu0
    elapsed = time.perf_counter() - started
    health = poller.stop()
    got = json.loads(out.strip().splitlines()[-1])
    m = summary(got, streams, args.soak, args.delay)
    ended = time.perf_counter()  # every session's finals must come and the sessions close
    while (left := sum(health_of(f)["streaming_sessions"] for f in fronts)) and (
        time.perf_counter() - ended < 60
    ):
        time.sleep(0.5)
    drained = (
        f"all closed {time.perf_counter() - ended:.1f} s after the load"
        if not left
        else (f"{left} STILL OPEN 60 s after the load")
    )
    settled = [rss for at, rss in samples if at >= 120] or [samples[-1][1]]
    print(
        f"soak: {streams} streams x {args.soak:.0f} s ({args.protocol}): "
        f"RSS {settled[0]:.1f} MB at 2 min -> {settled[-1]:.1f} MB at the end "
        f"(growth {settled[-1] - settled[0]:+.1f} MB, max {max(r for _, r in samples):.1f}); "
        f"calls {got['calls']}, dropped {m['dropped']}, errors {m['errors']}; sessions "
        f"{drained}; "
        f"CPU {cpu / (elapsed * streams):.4f} s/stream-s; finals {m['finals']}, "
        f"p50/p95 {m['final_p50']:.2f}/{m['final_p95']:.2f} s "
        f"(minus delay); partials {m['partials_per_stream_s']:.2f}/stream-s; /health p99/max "
        f"{pct(health, 99) * 1000:.0f}/{max(health) * 1000:.0f} ms; load lag p99 "
        f"{m['load_lag_p99_ms']:.0f} ms"
    )
    if got["errors"]:
        print("first errors:", got["errors"][:5])
    errors = sum(line.count("| ERROR") for front in fronts for line in front.lines)
    print(f"front log lines at ERROR: {errors}")


def health_of(front: ServerProcess) -> dict[str, Any]:
    return dict(httpx.get(front.url + "/health", timeout=10).json())


def start_fronts(count: int, backend_url: str) -> list[ServerProcess]:
    env = {
        "ENGINE": "remote",
        "REMOTE_BACKENDS": backend_url,
        "REMOTE_MAX_INFLIGHT": "256",
        "MAX_QUEUE": "4096",
        "WS_MAX_SESSIONS": "2000",
        "LOG_LEVEL": "ERROR",
        "PRELOAD": "true",  # probing the backends starts with the load
        "IDLE_TIMEOUT": "0",
        "REMOTE_PROBE_INTERVAL": "1",
    }
    fronts = [ServerProcess(env) for _ in range(count)]
    for front in fronts:
        front.wait_healthy(60)
        deadline = time.monotonic() + 30
        while health_of(front).get("backends_up") != 1:
            if time.monotonic() > deadline:
                raise SystemExit("the stand-in backend never came up")
            time.sleep(0.2)
    return fronts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", default="10,25,50,100,200")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--delay", type=float, default=0.12, help="the backend's answer time")
    parser.add_argument("--protocol", choices=("ws", "realtime", "pcmu"), default="ws")
    parser.add_argument("--chunk-ms", type=int, default=100, help="audio per client message")
    parser.add_argument("--fronts", type=int, default=1, help="front processes (streams split)")
    parser.add_argument(
        "--pin", action="store_true", help="fronts on core 0, load and stand-in on core 1"
    )
    parser.add_argument("--call-s", type=float, default=0.0, help="reconnect every S seconds")
    parser.add_argument("--soak", type=float, default=0.0, help="one N for this many seconds")
    args = parser.parse_args()
    port = free_port()
    backend = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "vllm_standin.py"), str(port), "--delay",
         str(args.delay)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    fronts: list[ServerProcess] = []
    try:
        fronts = start_fronts(args.fronts, f"http://127.0.0.1:{port}/v1")
        if args.pin:  # the fronts on core 0; the load generator and the stand-in on core 1
            for front in fronts:
                pin(front.proc.pid, {0})
            pin(backend.pid, {1})
        print(
            f"{args.fronts} front(s), protocol {args.protocol}, {args.chunk_ms} ms messages, "
            f"stand-in delay {args.delay * 1000:.0f} ms, {args.seconds:g} s per N"
        )
        if args.soak:
            soak(fronts, int(args.streams.split(",")[0]), args)
            return
        print("streams | CPU s/stream-s | streams/core | VAD share, frames per call | "
              "cores: fronts/load/stand-in | "
              "partials/stream-s | final p50/p95 (minus delay) | /health p99/max | "
              "RSS/stream | load lag p99 | dropped")  # fmt: skip
        for n in (int(v) for v in args.streams.split(",")):
            m = measure(fronts, {"standin": backend.pid}, n, args)
            fails = m["final_p95"] > GOAL_FINAL_S or m["health_max_ms"] > 100
            print(
                f"{n:7d} | {m['cpu_per_stream_s']:.4f} | {1 / m['cpu_per_stream_s']:.0f} | "
                f"{m['vad_share']:.0%}, {m['frames_per_call']:.1f} | "
                f"{m['front_cores']:.2f}/{m['load_cores']:.2f}/{m['standin_cores']:.2f} | "
                f"{m['partials_per_stream_s']:.2f} | {m['final_p50']:.2f}/{m['final_p95']:.2f} s "
                f"({m['finals']:.0f} finals) | {m['health_p99_ms']:.0f}/{m['health_max_ms']:.0f} "
                f"ms | {m['rss_per_stream_mb']:.2f} MB | {m['load_lag_p99_ms']:.0f} ms | "
                f"{m['dropped']:.0f} ({m['errors']:.0f} errors)"
                + ("  <- past the goal" if fails else ""),
                flush=True,
            )
    finally:
        for front in fronts:
            front.stop()
        backend.terminate()
        backend.wait(10)


if __name__ == "__main__":
    main()
