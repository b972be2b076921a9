"""Live speakers on `/ws/transcribe?diarize=true` (issue 51): accuracy, latency, diarizer CPU,
many streams at once, and the child's idle exit.

    .venv/bin/python bench/live_speakers.py [--only accuracy,human,latency,cpu,load,idle]
        [--streams 16] [--seconds 0] [--repeats 3] [--stagger 0.25] [--idle-timeout 5]

One real server process (whisper-tiny.en, `IDLE_TIMEOUT=0`) takes streams at real-time pace
(100 ms PCM frames) over real WebSockets; a second, short one (`IDLE_TIMEOUT=5`) times the
idle exit. Before anything is measured, one diarized stream warms the engine and the
speakers' child. Parts:

- accuracy: `tests/data/speech/meeting.wav` (3 voices, turns with gaps, one overlap) and a
  mix built from its turns: the first three turns as they are (each voice alone first), then
  three pairs of turns of different voices joined with no pause (a change of speaker inside
  one utterance), 1.2 s of silence after each pair. Finals' `[start, end, speaker]` are the
  hypothesis turns, scored on a 10 ms grid (tests/diar_metrics.py, 0.25 s collar, best
  mapping): accuracy = 1 - confusion; speech time without a labelled final is `missed`.
  `changes split` counts the joins with a change of speaker between two finals within
  0.75 s of them, and shows how far each join's nearest such change lies from it.
- human: mixes of real human read speech (tests/human_mixes.py: 3 and 5 people, FLEURS
  clips, 0.7 s gaps), scored as `accuracy`; `--human-repeats` runs of each.
- latency: end of speech -> final, `--repeats` runs of meeting.wav with and without
  diarization, alternating, on the same server. An end of speech is the last loud sample of
  a true turn (meeting.json) that no other turn goes on past, mapped to the wall clock when
  the frame holding it was sent; its final is the first to arrive that ends after it (0.5 s
  tolerance) and starts before it.
- cpu: the child's CPU seconds (`/health` live_speakers.cpu_seconds) over the diarized runs,
  per second of audio streamed; counted only while the child's pid did not change.
- load: `--streams` diarized streams of meeting.wav at once (stream i starts i * `--stagger`
  s late): end of speech -> final p50/p95 over every stream, finals with `speaker: null`, each
  stream's accuracy (mean and worst), and the child's CPU per stream-second under load.
- standin: the load part again, against `ENGINE=remote` and a stand-in backend that answers
  in 0.12 s (tests/vllm_standin.py): the server and the speakers' child under that many
  streams when the engine is not the limit. `--load-plain` runs each load without speakers
  too.
- idle: after the last diarized stream closes, the seconds until `/health` shows no child
  (live_speakers.pid null), and the child's RSS before it went.

`--seconds N` cuts every audio to its first N seconds (smoke runs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from common import ROOT, pct

import httpx
import numpy as np
import psutil
import soundfile as sf
from websockets.asyncio.client import connect

from diar_metrics import scores
from human_mixes import MIXES, human_mix
from proc import ServerProcess
from server import free_port
from streaming_client import pcm16

SPEECH = ROOT / "tests" / "data" / "speech"
RATE = 16000
CHUNK_S = 0.1
TAIL_S = 1.0  # silence sent after the audio, before the flush
# after the flush's answer, the stream ends when no final came for this long (1 s lost the
# last final of a human mix on a busy machine)
QUIET_S = 3.0
PAIRS = [(5, 6), (7, 2), (6, 1)]  # meeting.json turns joined with no pause (no overlap in them)
Turn = tuple[str, float, float]


@dataclass
class Clip:
    name: str
    audio: np.ndarray
    truth: list[Turn]
    joins: list[float] = field(default_factory=list)  # changes of speaker with no pause


@dataclass
class Run:
    started: float = 0.0
    sent_at: list[float] = field(default_factory=list)
    finals: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    late: float = 0.0  # the generator's worst lag behind real time

    def wall(self, at: float) -> float:
        """When the frame holding stream time `at` was sent."""
        return self.sent_at[min(len(self.sent_at) - 1, int(at / CHUNK_S))]

    def spoken(self) -> list[dict[str, Any]]:
        return [m for _, m in self.finals if m.get("text", "").strip()]

    def turns(self) -> list[Turn]:
        return [(m["speaker"], m["start"], m["end"]) for m in self.spoken() if m.get("speaker")]


def loud_bounds(audio: np.ndarray, start: float, end: float) -> tuple[int, int]:
    a, b = int(start * RATE), int(end * RATE)
    loud = np.nonzero(np.abs(audio[a:b]) > 0.01)[0]
    return a + int(loud[0]), a + int(loud[-1]) + 1


def meeting(seconds: float) -> Clip:
    audio, _ = sf.read(SPEECH / "meeting.wav", dtype="float32")
    truth = [
        (t["speaker"], t["start"], t["end"])
        for t in json.loads((SPEECH / "meeting.json").read_text())
    ]
    return cut(Clip("meeting.wav", audio, truth), seconds)


def mix(seconds: float) -> Clip:
    """meeting.wav's first three turns, then PAIRS of its turns joined with no pause."""
    whole = meeting(0)
    turns = whole.truth
    head = int((turns[2][2] + 0.5) * RATE)
    parts, truth, joins = [whole.audio[:head]], list(turns[:3]), []
    at = head
    for pair in PAIRS:
        for k, index in enumerate(pair):
            speaker, start, end = turns[index]
            a, b = loud_bounds(whole.audio, start, end)
            parts.append(whole.audio[a:b])
            truth.append((speaker, at / RATE, (at + b - a) / RATE))
            if k:
                joins.append(at / RATE)
            at += b - a
        parts.append(np.zeros(int(1.2 * RATE), np.float32))
        at += int(1.2 * RATE)
    return cut(Clip("mix (changes with no pause)", np.concatenate(parts), truth, joins), seconds)


def humans(seconds: float) -> list[Clip]:
    out = []
    for name in MIXES:
        audio, truth = human_mix(name)
        out.append(cut(Clip(name, audio, truth), seconds))
    return out


def cut(clip: Clip, seconds: float) -> Clip:
    if not seconds:
        return clip
    truth = [(s, a, min(b, seconds)) for s, a, b in clip.truth if a < seconds - 0.5]
    joins = [j for j in clip.joins if j < seconds - 1.0]
    return Clip(clip.name, clip.audio[: int(seconds * RATE)], truth, joins)


async def stream(base: str, audio: np.ndarray, diarize: bool, delay: float = 0.0) -> Run:
    """One stream at real-time pace, then TAIL_S of silence and a flush; every final kept."""
    await asyncio.sleep(delay)
    run = Run()
    audio = np.concatenate([audio, np.zeros(int(TAIL_S * RATE), np.float32)])
    url = base.replace("http://", "ws://") + "/ws/transcribe?sample_rate=16000"
    url += "&diarize=true" if diarize else ""
    try:
        async with connect(url, max_size=None, open_timeout=120) as ws:
            await ws.recv()  # connected

            async def reader() -> None:
                async for raw in ws:
                    message = json.loads(raw)
                    if message.get("is_final"):
                        run.finals.append((time.perf_counter(), message))
                    elif "code" in message:
                        run.errors.append(str(message)[:200])

            task = asyncio.create_task(reader())
            step = int(CHUNK_S * RATE)
            run.started = time.perf_counter()
            for k, i in enumerate(range(0, len(audio), step)):
                due = run.started + k * CHUNK_S
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                run.late = max(run.late, time.perf_counter() - due)
                await ws.send(pcm16(audio[i : i + step]))
                run.sent_at.append(time.perf_counter())
            flushed = time.perf_counter()
            await ws.send(json.dumps({"action": "flush"}))
            # the flush's answer, then QUIET_S without another final (or 60 s)
            while time.perf_counter() - flushed < 60 and not task.done():
                last = run.finals[-1][0] if run.finals else 0.0
                if last > flushed and time.perf_counter() - last > QUIET_S:
                    break
                await asyncio.sleep(0.05)
            else:
                if not task.done():
                    run.errors.append("no answer to the flush within 60 s")
            task.cancel()
    except Exception as exc:  # a refused or broken connection
        run.errors.append(f"{type(exc).__name__}: {exc}"[:200])
    return run


def speech_ends(clip: Clip) -> list[float]:
    """The last loud sample of each true turn that no other turn goes on past (an overlap or
    a join with no pause is one utterance)."""
    ends = []
    for i, (_, start, end) in enumerate(clip.truth):
        at = loud_bounds(clip.audio, start, min(end, len(clip.audio) / RATE))[1] / RATE
        if not any(a <= at + 0.3 < b for j, (_, a, b) in enumerate(clip.truth) if j != i):
            ends.append(at)
    return ends


def latencies(run: Run, clip: Clip) -> list[float]:
    out = []
    for end in speech_ends(clip):
        answers = [t for t, m in run.finals if m["end"] >= end - 0.5 and m["start"] < end]
        if answers:
            out.append(min(answers) - run.wall(end))
    return out


def cut_offsets(run: Run, joins: list[float]) -> list[float | None]:
    """For each join, how far the nearest change of speaker between consecutive finals lies
    from it (s; None: no change within 3 s)."""
    finals = run.spoken()
    changes = [
        a["end"] for a, b in itertools.pairwise(finals) if a.get("speaker") != b.get("speaker")
    ]
    out: list[float | None] = []
    for join in joins:
        near = min(changes, key=lambda c: abs(c - join), default=None)
        out.append(None if near is None or abs(near - join) > 3.0 else near - join)
    return out


def health(url: str) -> dict[str, Any]:
    return dict(httpx.get(url + "/health", timeout=10).json()["live_speakers"])


class CpuMeter:
    """The child's CPU over spans in which its pid stayed the same."""

    def __init__(self, url: str) -> None:
        self.url, self.cpu, self.seconds, self.skipped = url, 0.0, 0.0, 0

    @contextlib.contextmanager
    def span(self, runs: int, audio_s: float) -> Iterator[None]:
        before = health(self.url)
        yield
        after = health(self.url)
        if before["pid"] is None or after["pid"] != before["pid"]:
            self.skipped += 1
            return
        self.cpu += after["cpu_seconds"] - before["cpu_seconds"]
        self.seconds += runs * (audio_s + TAIL_S)

    def line(self, label: str) -> str:
        if not self.seconds:
            return f"{label}: not measured (the child restarted in {self.skipped} span(s))"
        per = self.cpu / self.seconds
        return (
            f"{label}: {per:.4f} CPU-s per stream-second ({self.cpu:.1f} CPU-s over "
            f"{self.seconds:.0f} stream-s; goal <= 0.05: {per / 0.05:.2f}x the goal)"
            + (f"; {self.skipped} span(s) skipped (restart)" if self.skipped else "")
        )


def score_line(clip: Clip, run: Run) -> str:
    s = scores(clip.truth, run.turns())
    nulls = sum(1 for m in run.spoken() if m.get("speaker") is None)
    true_n = len({t[0] for t in clip.truth})
    line = (
        f"{clip.name}: accuracy {1 - s['confusion']:.3f} (goal >= 0.95), speakers "
        f"{int(s['speakers'])} of {true_n}, missed {s['missed']:.3f}, false alarm "
        f"{s['false_alarm']:.3f}, DER {s['der']:.3f}, finals {len(run.spoken())} "
        f"({nulls} speaker null)"
    )
    if clip.joins:
        offsets = cut_offsets(run, clip.joins)
        split = sum(1 for o in offsets if o is not None and abs(o) <= 0.75)
        shown = ", ".join("none" if o is None else f"{o:+.2f}" for o in offsets)
        line += f", changes split {split}/{len(clip.joins)} (cut - change: {shown} s)"
    return line + (f"; errors {run.errors}" if run.errors else "")


def show(run: Run) -> str:
    return " | ".join(
        f"{m['start']:.2f}-{m['end']:.2f} {m.get('speaker')}: {m['text'][:40]}"
        for m in run.spoken()
    )


def dist(values: list[float]) -> str:
    if not values:
        return "none"
    return f"p50 {pct(values, 50):.3f} s, p95 {pct(values, 95):.3f} s (n={len(values)})"


def main_server(args: argparse.Namespace, parts: set[str]) -> None:
    env = {
        "MODEL_ID": "whisper-tiny.en",
        "PRELOAD": "true",
        "IDLE_TIMEOUT": "0",
        "DIARIZE_PRELOAD": "false",  # the uploads' diarizer: not used here
        "WS_MAX_SESSIONS": str(max(16, args.streams + 2)),
        "LOG_LEVEL": "WARNING",
    }
    server = ServerProcess(env)
    try:
        server.wait_healthy(180)
        warm(server.url)
        meet, cpu = meeting(args.seconds), CpuMeter(server.url)
        diarized: list[Run] = []
        if parts & {"accuracy", "latency", "cpu"}:
            plain: list[Run] = []
            for _ in range(args.repeats if "latency" in parts else 1):
                with cpu.span(1, len(meet.audio) / RATE):
                    diarized.append(asyncio.run(stream(server.url, meet.audio, True)))
                if "latency" in parts:
                    plain.append(asyncio.run(stream(server.url, meet.audio, False)))
            if "accuracy" in parts:
                print(score_line(meet, diarized[0]))
                print(f"  finals: {show(diarized[0])}")
                both = mix(args.seconds)
                with cpu.span(1, len(both.audio) / RATE):
                    mixed = asyncio.run(stream(server.url, both.audio, True))
                print(score_line(both, mixed))
                print(f"  finals: {show(mixed)}")
            if "latency" in parts:
                on = [x for r in diarized for x in latencies(r, meet)]
                off = [x for r in plain for x in latencies(r, meet)]
                print(f"end of speech -> final, diarize=true:  {dist(on)}")
                print(f"end of speech -> final, diarize=false: {dist(off)}")
                if on and off:
                    diff = pct(on, 50) - pct(off, 50)
                    print(
                        f"  difference p50 {diff:+.3f} s (goal <= +0.2 s), p95 "
                        f"{pct(on, 95) - pct(off, 95):+.3f} s"
                    )
                lag = max(r.late for r in diarized + plain)
                print(f"  the sender's worst lag behind real time: {lag * 1000:.0f} ms")
            if "cpu" in parts:
                print(cpu.line("diarizer CPU, one stream at a time"))
        if "human" in parts:
            for clip in humans(args.seconds):
                for _ in range(args.human_repeats):
                    run = asyncio.run(stream(server.url, clip.audio, True))
                    print(score_line(clip, run))
                    print(f"  finals: {show(run)}")
                    if args.dump:  # every final, empty ones too, as JSON lines
                        with open(f"{args.dump}/{clip.name}.jsonl", "a") as out:
                            out.writelines(json.dumps(m) + "\n" for _, m in run.finals)
        if "load" in parts:
            load(server.url, meet, args)
        print(f"live_speakers at the end: {health(server.url)}")
    finally:
        server.stop()


def warm(url: str) -> None:
    """One diarized stream of a few seconds; then wait for the child to be ready."""
    audio, _ = sf.read(SPEECH / "meeting.wav", dtype="float32")
    run = asyncio.run(stream(url, audio[: 6 * RATE], True))
    deadline = time.monotonic() + 180
    while health(url)["state"] != "ready" and time.monotonic() < deadline:
        time.sleep(0.2)
    print(f"warm-up: {len(run.spoken())} final(s), live_speakers {health(url)}")


def many(url: str, meet: Clip, args: argparse.Namespace, diarize: bool) -> list[Run]:
    async def together() -> list[Run]:
        starts = (i * args.stagger for i in range(args.streams))
        return list(await asyncio.gather(*(stream(url, meet.audio, diarize, t) for t in starts)))

    return asyncio.run(together())


def load(url: str, meet: Clip, args: argparse.Namespace, label: str = "") -> None:
    if args.load_plain:  # the same streams without speakers: what the engine alone gives
        lat = [x for r in many(url, meet, args, False) for x in latencies(r, meet)]
        print(f"{args.streams} plain streams at once{label}: end of speech -> final {dist(lat)}")
    cpu = CpuMeter(url)
    with cpu.span(args.streams, len(meet.audio) / RATE):
        runs = many(url, meet, args, True)
    lat = [x for r in runs for x in latencies(r, meet)]
    finals = [m for r in runs for m in r.spoken()]
    nulls = sum(1 for m in finals if m.get("speaker") is None)
    acc = [1 - scores(meet.truth, r.turns())["confusion"] for r in runs]
    found = [int(scores(meet.truth, r.turns())["speakers"]) for r in runs]
    print(
        f"{args.streams} diarized streams at once{label}: end of speech -> final {dist(lat)} "
        f"(goal p95 <= 1.5 s: {pct(lat, 95) / 1.5 if lat else float('nan'):.2f}x)"
    )
    print(f"  finals {len(finals)}, speaker null {nulls} ({nulls / max(1, len(finals)):.3f})")
    print(
        f"  accuracy per stream: mean {statistics.mean(acc):.3f}, worst {min(acc):.3f}; "
        f"speakers found per stream {sorted(found)}"
    )
    print(f"  the sender's worst lag behind real time: {max(r.late for r in runs) * 1000:.0f} ms")
    errors = [e for r in runs for e in r.errors]
    if errors:
        print(f"  errors ({len(errors)}): {errors[:5]}")
    print(cpu.line(f"diarizer CPU, {args.streams} streams"))


def standin_load(args: argparse.Namespace) -> None:
    """The load part against `ENGINE=remote` and a stand-in backend that answers every
    transcription after 0.12 s (tests/vllm_standin.py, its own process): what the server
    and the speakers' child hold when the engine is not the limit (whisper-tiny.en on these
    2 cores is: it decodes one request at a time)."""
    port = free_port()
    backend = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "vllm_standin.py"), str(port), "--delay", "0.12"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    env = {
        "ENGINE": "remote",
        "REMOTE_BACKENDS": f"http://127.0.0.1:{port}/v1",
        "PRELOAD": "true",
        "IDLE_TIMEOUT": "0",
        "DIARIZE_PRELOAD": "false",
        "WS_MAX_SESSIONS": str(max(16, args.streams + 2)),
        "LOG_LEVEL": "WARNING",
    }
    server = ServerProcess(env)
    try:
        server.wait_healthy(180)
        deadline = time.monotonic() + 60
        while httpx.get(server.url + "/health").json().get("backends_up") != 1:
            if time.monotonic() > deadline:
                raise SystemExit("the stand-in backend never came up")
            time.sleep(0.2)
        warm(server.url)
        load(server.url, meeting(args.seconds), args, " (stand-in engine, 0.12 s)")
    finally:
        server.stop()
        backend.terminate()
        backend.wait(10)


def idle(args: argparse.Namespace) -> None:
    env = {
        "MODEL_ID": "whisper-tiny.en",
        "PRELOAD": "true",
        "IDLE_TIMEOUT": str(args.idle_timeout),
        "DIARIZE_PRELOAD": "false",
        "LOG_LEVEL": "WARNING",
    }
    server = ServerProcess(env)
    try:
        server.wait_healthy(180)
        audio, _ = sf.read(SPEECH / "meeting.wav", dtype="float32")
        run = asyncio.run(stream(server.url, audio[: 6 * RATE], True))
        closed = time.perf_counter()
        status = health(server.url)
        pid = status["pid"]
        rss = psutil.Process(pid).memory_info().rss / 2**20 if pid else 0.0
        while (status := health(server.url))["pid"] is not None:
            if time.perf_counter() - closed > args.idle_timeout + 120:
                break
            time.sleep(0.1)
        with contextlib.suppress(psutil.Error):  # /health lets go first; the exit follows
            psutil.Process(pid).wait(15)
        gone = time.perf_counter() - closed
        print(
            f"idle (IDLE_TIMEOUT={args.idle_timeout:g}): the child ({rss:.0f} MB RSS) gone "
            f"{gone:.1f} s after the last diarized stream closed (state {status['state']}, pid "
            f"{status['pid']}; process {pid} exited: {not psutil.pid_exists(pid or 0)}; "
            f"{len(run.spoken())} final(s) before)"
        )
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="accuracy,human,latency,cpu,load,standin,idle")
    parser.add_argument("--dump", default="", help="human: write every final to DIR/<mix>.jsonl")
    parser.add_argument("--human-repeats", type=int, default=1, help="runs of each human mix")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=0.0, help="cut the audio (0: whole)")
    parser.add_argument("--repeats", type=int, default=3, help="latency runs of each kind")
    parser.add_argument("--stagger", type=float, default=0.25, help="s between stream starts")
    parser.add_argument("--idle-timeout", type=float, default=5.0)
    parser.add_argument(
        "--load-plain", action="store_true", help="load: also the streams without speakers"
    )
    args = parser.parse_args()
    parts = {p.strip() for p in args.only.split(",") if p.strip()}
    unknown = parts - {"accuracy", "human", "latency", "cpu", "load", "standin", "idle"}
    if unknown:
        parser.error(f"unknown parts: {sorted(unknown)}")
    if parts - {"idle", "standin"}:
        main_server(args, parts)
    if "standin" in parts:
        standin_load(args)
    if "idle" in parts:
        idle(args)


if __name__ == "__main__":
    main()
