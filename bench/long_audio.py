"""Long audio benchmark (issue 4): SSE time to first event vs total for the 2-minute clip,
and peak RSS while transcribing a 1-hour file.

    .venv/bin/python bench/long_audio.py [--minutes 60]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

from common import pct

import httpx
import soundfile as sf

import speech
from proc import ServerProcess


def vm(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def long_flac(minutes: int) -> Path:
    """Exactly `minutes` long (MAX_AUDIO_SECONDS is 3600 by default)."""
    path = Path(tempfile.gettempdir()) / f"qwen3-asr-bench-{minutes}min-v2.flac"
    if not path.exists():
        audio, rate = sf.read(speech.path("long_2min.wav"), dtype="float32")
        left = minutes * 60 * rate
        with sf.SoundFile(path, "w", rate, 1, format="FLAC") as f:
            while left > 0:
                f.write(audio[:left])
                left -= min(left, len(audio))
    return path


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=int, default=60)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    server = ServerProcess({"MODEL_ID": "whisper-tiny.en", "LOG_LEVEL": "WARNING"})
    try:
        server.wait_healthy()
        clip = speech.path("long_2min.wav").read_bytes()
        firsts, totals = [], []
        for _ in range(args.runs):
            started = time.perf_counter()
            arrivals = []
            with httpx.stream(
                "POST",
                server.url + "/v1/audio/transcriptions",
                files={"file": ("a.wav", clip)},
                data={"stream": "true"},
                timeout=600,
            ) as response:
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        arrivals.append(time.perf_counter() - started)
            firsts.append(arrivals[0])
            totals.append(arrivals[-1])
        print(
            f"2-minute clip over SSE: first event p50 {pct(firsts, 50):.2f} s, "
            f"all done p50 {pct(totals, 50):.2f} s "
            f"(first event at {pct(firsts, 50) / pct(totals, 50) * 100:.0f}% of the total)"
        )
        rss_warm = vm(server.proc.pid, "VmRSS")
        path = long_flac(args.minutes)
        size_mb = path.stat().st_size / 1e6
        started = time.perf_counter()
        response = httpx.post(
            server.url + "/v1/audio/transcriptions",
            files={"file": (path.name, path.read_bytes())},
            data={"response_format": "verbose_json"},
            timeout=3600,
        )
        response.raise_for_status()
        elapsed = time.perf_counter() - started
        body = response.json()
        peak = vm(server.proc.pid, "VmHWM")
        pcm_mb = body["duration"] * 16000 * 4 / 1e6
        print(
            f"{args.minutes}-minute FLAC ({size_mb:.1f} MB upload, {pcm_mb:.0f} MB as 16 kHz "
            f"float32): {elapsed:.1f} s, {len(body['segments'])} segments; RSS before "
            f"{rss_warm:.0f} MB, peak {peak:.0f} MB (+{peak - rss_warm:.0f} MB)"
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
