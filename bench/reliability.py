"""Reliability under hostile and concurrent traffic (issue 9), against a real server process
(`python -m qwen3_asr_server`, whisper-tiny.en).

    .venv/bin/python bench/reliability.py [--only sessions,big,bursts,left,mixed,upload]

Run it against another checkout with PYTHONPATH=OTHER/src to get before/after figures.
Figures go to docs/RELIABILITY.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
from typing import Any

from common import pct

import httpx
import numpy as np

import speech
from proc import ServerProcess
from streaming_client import Collector, load, open_ws, pcm16
from wer import wer

SENTENCES = sorted(speech.sentences())


def stream_paced(ws: Any, audio: np.ndarray, speed: float = 1.0) -> None:
    step = 1600
    started = time.perf_counter()
    for i in range(0, len(audio), step):
        delay = started + i / 16000 / speed - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        ws.send(pcm16(audio[i : i + step]))


def twenty_sessions(url: str, count: int = 20) -> None:
    """Each session speaks two different sentences; its finals must match its own audio."""
    texts = speech.sentences()
    plan = [(SENTENCES[i % 12], SENTENCES[(i * 5 + 1) % 12]) for i in range(count)]
    results: list[list[str]] = [[] for _ in range(count)]
    errors: list[str] = []

    def one(k: int) -> None:
        pieces = []
        for name in plan[k]:
            pieces += [load(name), np.zeros(16000, np.float32)]
        try:
            with open_ws(url) as ws:
                c = Collector(ws)
                stream_paced(ws, np.concatenate(pieces))
                ws.send(json.dumps({"action": "flush"}))
                c.wait_for(lambda c: len(c.finals()) >= 3, timeout=60)
                results[k] = [t for t in c.finals() if t]
        except Exception as exc:
            errors.append(repr(exc))

    threads = [threading.Thread(target=one, args=(k,)) for k in range(count)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    own, best_other, lost, mismatched = [], [], 0, 0
    for k, finals in enumerate(results):
        expected = " ".join(texts[n] for n in plan[k])
        got = " ".join(finals)
        if len(finals) < len(plan[k]):
            lost += len(plan[k]) - len(finals)
        mine = wer([expected], [got])
        others = [
            wer([" ".join(texts[n] for n in plan[j])], [got])
            for j in range(count)
            if set(plan[j]) != set(plan[k])
        ]
        own.append(mine)
        best_other.append(min(others))
        mismatched += mine >= min(others)
    print(
        f"{count} concurrent sessions ({time.perf_counter() - started:.1f} s): WER to own "
        f"speech mean {np.mean(own):.2f} (max {max(own):.2f}), to the closest other session's "
        f"{np.mean(best_other):.2f}; sessions closer to another's speech: {mismatched}; "
        f"sentences without a final: {lost}; client errors: {len(errors)}"
    )


def health_latency_during(url: str, work: Any) -> list[float]:
    latencies: list[float] = []
    done = threading.Event()

    def run() -> None:
        try:
            work()
        finally:
            done.set()

    worker = threading.Thread(target=run)
    worker.start()
    with httpx.Client(timeout=10) as client:
        while not done.is_set():
            t = time.perf_counter()
            client.get(url + "/health")
            latencies.append(time.perf_counter() - t)
            time.sleep(0.01)
    worker.join()
    return latencies


def big_sender(url: str) -> None:
    """60 s of speech sent in 1 MB messages as fast as the server reads them."""
    audio = np.tile(load("long_2min.wav")[: 16000 * 30], 2)
    message = 1_000_000 // 2  # samples per 1 MB message

    def work() -> None:
        with open_ws(url) as ws:
            c = Collector(ws)
            for i in range(0, len(audio), message):
                ws.send(pcm16(audio[i : i + message]))
            ws.send(json.dumps({"action": "flush"}))
            c.wait_for(lambda c: any(t == "" or t for t in c.finals()) and _quiet(c), 120)

    lat = health_latency_during(url, work)
    print(
        f"60 s sent in 1 MB messages: /health latency max {max(lat) * 1000:.0f} ms, p95 "
        f"{pct(lat, 95) * 1000:.0f} ms, p50 {pct(lat, 50) * 1000:.0f} ms over {len(lat)} polls "
        "(goal: max < 100 ms)"
    )


def _quiet(c: Collector, seconds: float = 2.0) -> bool:
    return bool(c.messages) and time.perf_counter() - c.messages[-1][0] > seconds


def bursts(url: str, clients: int = 4) -> None:
    """Clients send three bursts of speech as fast as they can, then vanish."""
    audio = load("long_2min.wav")

    def one(k: int) -> None:
        with open_ws(url) as ws:
            for b in range(3):
                start = (k * 3 + b) * 16000 * 8 % (len(audio) - 16000 * 8)
                for i in range(start, start + 16000 * 8, 16000):
                    ws.send(pcm16(audio[i : i + 16000]))
                time.sleep(0.2)
        # closed without a flush

    threads = [threading.Thread(target=one, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gone = time.perf_counter()
    deadline = gone + 120
    health: dict[str, Any] = {}
    while time.perf_counter() < deadline:
        health = httpx.get(url + "/health", timeout=10).json()
        if health["streaming_sessions"] == 0 and health["queue_depth"] == 0 and not health["busy"]:
            break
        time.sleep(0.05)
    settled = time.perf_counter() - gone
    t = time.perf_counter()
    r = httpx.post(
        url + "/v1/audio/transcriptions",
        files={"file": ("a.wav", speech.path("sentence_03.wav").read_bytes())},
        timeout=120,
    )
    print(
        f"{clients} clients x 3 bursts of 8 s then disconnect: sessions "
        f"{health['streaming_sessions']}, queue {health['queue_depth']} after {settled:.1f} s; "
        f"next upload {r.status_code} in {time.perf_counter() - t:.2f} s"
    )


def left(url: str, clients: int = 3, seconds: int = 60) -> None:
    """Clients burst `seconds` of speech each and disconnect at once; then an upload. Their
    finals run at batch priority (no one waits for them): the upload is not stuck behind
    them (issue 29: it waited ~22 s; goal under 15 s)."""
    audio = load("long_2min.wav")

    def one(k: int) -> None:
        start = k * 16000 * 20 % (len(audio) - 16000 * seconds)
        with open_ws(url) as ws:
            for i in range(start, start + 16000 * seconds, 16000):
                ws.send(pcm16(audio[i : i + 16000]))
        # closed without a flush or waiting for a final

    threads = [threading.Thread(target=one, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    t = time.perf_counter()
    r = httpx.post(
        url + "/v1/audio/transcriptions",
        files={"file": ("a.wav", speech.path("sentence_03.wav").read_bytes())},
        timeout=300,
    )
    waited = time.perf_counter() - t
    deadline = time.perf_counter() + 300
    while time.perf_counter() < deadline:
        health = httpx.get(url + "/health", timeout=10).json()
        if health["streaming_sessions"] == 0:
            break
        time.sleep(0.1)
    drained = time.perf_counter() - t
    print(
        f"{clients} clients x {seconds} s burst then disconnect: next upload {r.status_code} "
        f"in {waited:.1f} s (goal < 15 s); their finals all done after {drained:.1f} s"
    )


def mixed(url: str, server: ServerProcess, count: int = 300) -> None:
    """RSS growth over `count` mixed requests after a warm-up."""
    clip = speech.path("sentence_05.wav").read_bytes()
    formats = ["json", "text", "srt", "vtt", "verbose_json"]

    def request(i: int, client: httpx.Client) -> None:
        kind = i % 8
        if kind < 5:
            client.post(
                url + "/v1/audio/transcriptions",
                files={"file": ("a.wav", clip)},
                data={"response_format": formats[kind]},
            )
        elif kind == 5:
            client.post(
                url + "/v1/audio/transcriptions",
                files={"file": ("a.wav", clip)},
                data={"stream": "true"},
            )
        elif kind == 6:
            client.post(url + "/v1/audio/transcriptions", files={"file": ("a.wav", b"nonsense")})
        else:
            with open_ws(url, use_server_vad="false") as ws:
                ws.send(pcm16(load("sentence_05.wav")[:32000]))
                ws.send(json.dumps({"action": "flush"}))
                for _ in range(20):
                    if json.loads(ws.recv(timeout=30)).get("is_final"):
                        break

    with httpx.Client(timeout=120) as client:
        for i in range(40):
            request(i, client)
        before = server.rss_mb()
        started = time.perf_counter()
        for i in range(count):
            request(i, client)
        after = server.rss_mb()
    print(
        f"{count} mixed requests ({time.perf_counter() - started:.0f} s): RSS {before:.0f} -> "
        f"{after:.0f} MB ({after - before:+.1f} MB; goal < 30 MB)"
    )


def upload_with_streams(url: str, streams: int = 8) -> None:
    """A 2-minute upload while `streams` sessions speak: it must finish within its timeout."""
    data = speech.path("long_2min.wav").read_bytes()

    def upload() -> tuple[int, float]:
        t = time.perf_counter()
        r = httpx.post(
            url + "/v1/audio/transcriptions", files={"file": ("a.wav", data)}, timeout=600
        )
        return r.status_code, time.perf_counter() - t

    alone = upload()
    stop = threading.Event()
    audio = np.concatenate([load("three_sentences.wav"), np.zeros(16000, np.float32)])

    def speaker() -> None:
        with open_ws(url) as ws:
            Collector(ws)
            while not stop.is_set():
                stream_paced(ws, audio)

    threads = [threading.Thread(target=speaker, daemon=True) for _ in range(streams)]
    for t in threads:
        t.start()
    time.sleep(2)
    busy = upload()
    stop.set()
    for t in threads:
        t.join(60)
    print(
        f"2-minute upload alone {alone[1]:.1f} s ({alone[0]}); with {streams} streams speaking "
        f"{busy[1]:.1f} s ({busy[0]}) (REQUEST_TIMEOUT 300 s per segment)"
    )


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="sessions,big,bursts,left,mixed,upload")
    args = parser.parse_args()
    chosen = set(args.only.split(","))
    env = {
        "MODEL_ID": "whisper-tiny.en",
        "LOG_LEVEL": "WARNING",
        "PRELOAD": "true",
        "WS_MAX_SESSIONS": "32",
    }
    server = ServerProcess(env)
    try:
        server.wait_healthy()
        time.sleep(2)
        if "sessions" in chosen:
            twenty_sessions(server.url)
        if "big" in chosen:
            big_sender(server.url)
        if "bursts" in chosen:
            bursts(server.url)
        if "left" in chosen:
            left(server.url)
        if "mixed" in chosen:
            mixed(server.url, server)
        if "upload" in chosen:
            upload_with_streams(server.url)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
