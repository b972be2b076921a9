"""Deepgram's `/v1/listen` against `/ws/transcribe` on the same audio (issue 52's goals).

    .venv/bin/python bench/listen.py [--sentences 12] [--rounds 2] [--end-silence-ms 500]
    .venv/bin/python bench/listen.py --quick      # one sentence, one round: a smoke run

One server process (whisper-tiny.en, `PRELOAD=true`, `WS_END_SILENCE_MS=--end-silence-ms`).
Each stream sends the espeak-ng sentences of tests/data/speech at real-time pace in 100 ms
PCM chunks, each sentence followed by 1.2 s of silence: the track bench/streaming.py sends.
One stream at a time, the two routes alternating (`--rounds` of each, the first route of a
round swapped every round), after one unmeasured sentence through each.

- `/ws/transcribe?sample_rate=16000`: finals are the `is_final` messages.
- `/v1/listen?encoding=linear16&sample_rate=16000&interim_results=true&endpointing=<ms>`:
  finals are the `Results` with `speech_final: true`, the ones ended by silence. The
  `endpointing` sent is the server's WS_END_SILENCE_MS, so both routes end an utterance on
  the same silence (an absent `endpointing` means the same thing; an explicit one keeps the
  comparison fair if the setting changes). Deepgram clients often send less (LiveKit 25 ms,
  counted as 300 ms here: docs/DEEPGRAM.md), which ends utterances sooner: not what this
  compares. `interim_results=true` keeps the partials flowing, as /ws/transcribe always does.

End of speech = a sentence's last sample above 0.02 (`common.sentence_track`); latency =
the first non-empty final to arrive after the chunk holding it was sent, before the next
sentence's end was sent (bench/streaming.py's measure; WS_END_SILENCE_MS is inside it).
Once every sentence has its final (or 30 s passed), the stream is ended the protocol's way
(`{"action": "flush"}` and its answer; `CloseStream` and the close) so nothing buffered is
lost, and WER is scored over all of a route's finals (`is_final` results on /v1/listen)
against the sentences' transcripts (tests/wer.py's normalisation).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from common import pct, sentence_track

import numpy as np
from websockets.sync.client import ClientConnection, connect

import speech
from proc import ServerProcess
from streaming_client import CHUNK_S, Collector, open_ws, pcm16
from wer import wer

TAIL_SILENCE_S = 1.2  # after each sentence, as bench/streaming.py
RATE = 16000
ROUTES = ("/ws/transcribe", "/v1/listen")


@dataclass
class Result:
    latencies: list[float] = field(default_factory=list)
    finals: int = 0  # silence-ended finals with text
    sentences: int = 0
    references: list[str] = field(default_factory=list)
    hypotheses: list[str] = field(default_factory=list)


def silence_final(route: str, message: dict[str, Any]) -> bool:
    """A final ended by silence, with words."""
    if route == "/ws/transcribe":
        return bool(message.get("is_final") and message.get("text", "").strip())
    return bool(message.get("speech_final") and transcript(message).strip())


def transcript(message: dict[str, Any]) -> str:
    """A /v1/listen final's text ("" for anything else)."""
    if message.get("type") != "Results" or not message.get("is_final"):
        return ""
    return str(message["channel"]["alternatives"][0]["transcript"])


def connect_route(url: str, route: str, end_silence_ms: int) -> ClientConnection:
    if route == "/ws/transcribe":
        return open_ws(url, sample_rate=str(RATE))
    query = "encoding=linear16&sample_rate=16000&interim_results=true"
    ws_url = url.replace("http://", "ws://") + f"/v1/listen?{query}&endpointing={end_silence_ms}"
    return connect(ws_url, open_timeout=30, max_size=2**22)


def send_paced(ws: ClientConnection, audio: np.ndarray) -> float:
    """Send `audio` in CHUNK_S chunks at real-time pace; return when the first was due."""
    step = int(RATE * CHUNK_S)
    started = time.perf_counter()
    for i in range(0, len(audio), step):
        delay = started + i / RATE - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        ws.send(pcm16(audio[i : i + step]))
    return started


def end_stream(ws: ClientConnection, route: str, collector: Collector) -> None:
    """The protocol's end: everything buffered comes back as finals before the close."""
    if route == "/ws/transcribe":
        asked = time.perf_counter()
        ws.send(json.dumps({"action": "flush"}))
        collector.wait_for(
            lambda c: any(t >= asked and m.get("is_final") for t, m in c.messages), 30
        )
    else:
        ws.send(json.dumps({"type": "CloseStream"}))
        collector.closed.wait(30)


def run(url: str, route: str, names: list[str], end_silence_ms: int, out: Result) -> None:
    audio, ends = sentence_track(names, TAIL_SILENCE_S)
    with connect_route(url, route, end_silence_ms) as ws:
        collector = Collector(ws)
        started = send_paced(ws, audio)
        collector.wait_for(
            lambda c: sum(silence_final(route, m) for _, m in c.messages) >= len(names), 30
        )
        end_stream(ws, route, collector)
    arrivals = [t for t, m in collector.messages if silence_final(route, m)]
    # the chunk holding the end of speech was sent at started + ceil(end / chunk) * chunk
    sent = [started + np.ceil(end / CHUNK_S) * CHUNK_S for end in ends]
    for k, end_sent in enumerate(sent):
        until = sent[k + 1] if k + 1 < len(sent) else float("inf")
        after = [t for t in arrivals if end_sent <= t < until]
        if after:
            out.latencies.append(after[0] - end_sent)
    texts = [
        m.get("text", "") if route == "/ws/transcribe" else transcript(m)
        for _, m in collector.messages
        if m.get("is_final")
    ]
    said = speech.sentences()
    out.references.append(" ".join(said[name] for name in names))
    out.hypotheses.append(" ".join(t for t in texts if t.strip()))
    out.finals += len(arrivals)
    out.sentences += len(names)


def row(label: str, ws: float, listen: float, unit: str, scale: float = 1.0) -> str:
    ratio = f"{listen / ws:.2f}x" if ws else ("1.00x" if listen == ws else "n/a")
    return f"| {label} | {ws * scale:.3f} {unit} | {listen * scale:.3f} {unit} | {ratio} |"


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser()
    parser.add_argument("--sentences", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--end-silence-ms", type=int, default=500)
    parser.add_argument("--quick", action="store_true", help="one sentence, one round")
    args = parser.parse_args()
    if args.quick:
        args.sentences, args.rounds = 1, 1
    names = sorted(speech.sentences())[: args.sentences]
    server = ServerProcess(
        {
            "MODEL_ID": "whisper-tiny.en",
            "LOG_LEVEL": "WARNING",
            "PRELOAD": "true",
            "WS_END_SILENCE_MS": str(args.end_silence_ms),
        }
    )
    results = {route: Result() for route in ROUTES}
    began = time.perf_counter()
    try:
        server.wait_healthy(60)
        for route in ROUTES:  # warm-up: the model loaded, each route's first stream
            run(server.url, route, names[:1], args.end_silence_ms, Result())
        for r in range(args.rounds):
            for route in ROUTES if r % 2 == 0 else ROUTES[::-1]:
                run(server.url, route, names, args.end_silence_ms, results[route])
    finally:
        server.stop()
    ws, listen = (results[route] for route in ROUTES)
    print(
        f"whisper-tiny.en, WS_END_SILENCE_MS={args.end_silence_ms} (endpointing="
        f"{args.end_silence_ms} on /v1/listen), {len(names)} sentences x {args.rounds} "
        f"rounds per route, one stream at a time ({time.perf_counter() - began:.0f} s)\n"
    )
    print("| measure | /ws/transcribe | /v1/listen | ratio (listen / ws) |\n|---|---|---|---|")
    for q in (50, 95):
        a, b = (pct(r.latencies, q) if r.latencies else float("nan") for r in (ws, listen))
        print(row(f"end of speech → final, p{q}", a, b, "s"))
    print(
        row(
            "WER",
            wer(ws.references, ws.hypotheses),
            wer(listen.references, listen.hypotheses),
            "%",
            100,
        )
    )
    print(
        f"| silence finals / sentences | {ws.finals} / {ws.sentences} | "
        f"{listen.finals} / {listen.sentences} | |"
    )
    print("\ngoals: listen's p50 ≤ 0.8 s; listen's WER equal to /ws/transcribe's")


if __name__ == "__main__":
    main()
