"""Upload load helpers shared by tests/test_uploads.py and bench/uploads.py (issue 19)."""

from __future__ import annotations

import io
import os
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import soundfile as sf

import speech


def metric(url: str, name: str) -> float:
    """Sum of a metric's samples in /metrics (0 when absent)."""
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith((name + " ", name + "{")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def engine_calls(url: str) -> tuple[int, int]:
    """(engine calls started, segments in them) so far."""
    return int(metric(url, "asr_batch_size_count")), int(metric(url, "asr_batch_size_sum"))


def idle(url: str) -> bool:
    body = httpx.get(url + "/health", timeout=10).json()
    return not body["busy"] and body["queue_depth"] == 0


def leave_early(url: str, clients: int = 3, patience: float = 2.0) -> dict[str, float]:
    """`clients` uploads of the 2-minute clip whose clients time out after `patience` s:
    engine calls (and segments) started after they left, and seconds until idle."""
    clip = speech.path("long_2min.wav").read_bytes()
    before = engine_calls(url)
    answered: list[int] = []  # uploads that ended before their client gave up: statuses

    def one() -> None:
        try:
            response = httpx.post(
                url + "/v1/audio/transcriptions",
                files={"file": ("long.wav", clip, "audio/wav")},
                timeout=patience,
            )
        except httpx.TimeoutException:
            return
        answered.append(response.status_code)

    threads = [threading.Thread(target=one) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # raised here, not in a thread (where pytest would only warn): a run in which the
    # uploads ended early proves nothing about clients that leave
    assert not answered, f"uploads answered before their clients gave up: {answered}"
    left_at = time.perf_counter()
    at_leave = engine_calls(url)
    while not idle(url) and time.perf_counter() - left_at < 120:
        time.sleep(0.05)
    idle_after = time.perf_counter() - left_at
    time.sleep(0.5)
    after = engine_calls(url)
    return {
        "clients_left": clients - len(answered),
        "calls_before_leaving": at_leave[0] - before[0],
        "calls_after_leaving": after[0] - at_leave[0],
        "segments_after_leaving": after[1] - at_leave[1],
        "idle_after_s": idle_after,
    }


def quiet_flac(seconds: int = 3600, level: float = 0.001) -> bytes:
    """FLAC of low noise (`level` ~ -60 dBFS: ~45 MB an hour, as a real quiet room) or, with
    level 0, digital silence (a few hundred kB). Cached in the temp directory."""
    path = Path(tempfile.gettempdir()) / f"qwen3-asr-quiet-{seconds}s-{level:g}.flac"
    if not path.exists():
        rng = np.random.default_rng(0)
        buf = io.BytesIO()
        with sf.SoundFile(buf, "w", 16000, 1, format="FLAC") as f:
            for _ in range(0, seconds, 60):
                f.write((rng.standard_normal(16000 * 60) * level).astype(np.float32))
        part = path.with_suffix(f".{os.getpid()}.part")  # parallel test processes: atomic
        part.write_bytes(buf.getvalue())
        part.replace(path)
    return path.read_bytes()


def vm(pid: int, field: str) -> float:
    """VmRSS / VmHWM of a process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def many_big(
    url: str, pid: int, data: bytes, clients: int = 12, patience: float | None = None
) -> dict[str, object]:
    """`clients` concurrent uploads of `data`: status codes (0: the client gave up after
    `patience` s), Retry-After values, wall time and the server's peak RSS."""
    codes: list[int] = []
    retry_after: list[str] = []
    lock = threading.Lock()

    def one() -> None:
        try:
            r = httpx.post(
                url + "/v1/audio/transcriptions",
                files={"file": ("quiet.flac", data, "audio/flac")},
                timeout=patience or 3600,
            )
        except httpx.TimeoutException:
            with lock:
                codes.append(0)
            return
        with lock:
            codes.append(r.status_code)
            if "retry-after" in r.headers:
                retry_after.append(r.headers["retry-after"])

    rss_before = vm(pid, "VmRSS")
    started = time.perf_counter()
    threads = [threading.Thread(target=one) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {
        "upload_mb": round(len(data) / 1e6, 1),
        "codes": sorted(codes),
        "retry_after": sorted(set(retry_after)),
        "seconds": round(time.perf_counter() - started, 1),
        "rss_before_mb": round(rss_before),
        "rss_peak_mb": round(vm(pid, "VmHWM")),
    }
