"""`qwen3-asr-server transcribe FILE|DIR ...`: files to txt/srt/vtt/json/verbose_json from the
shell (issue 33).

Without `--server` it runs in this process with the server's own settings, engine,
segmentation and formats (no HTTP server); with `--server URL` it sends each file to a running
server (this one or any OpenAI-compatible one) through the `openai` SDK and writes the body it
answers. `--jobs` files at a time. Progress (rich) per file and overall in audio seconds with
an ETA, only on a terminal; a line per file otherwise. A file whose outputs exist is skipped
unless `--overwrite`; a failed file is reported and the rest go on; exit code 1 if any failed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import Settings
from .transcribe_backends import FORMATS, Calls, Job, Local, Remote

if TYPE_CHECKING:
    from rich.console import Console

AUDIO_SUFFIXES = {".wav", ".mp3", ".flac", ".ogg", ".opus", ".m4a", ".mp4", ".webm", ".aac",
                  ".wma", ".aiff", ".aif", ".mka", ".mkv", ".mov", ".amr", ".3gp"}  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="FILE|DIR",
        type=Path,
        help="audio files, or directories whose audio files are all taken",
    )
    parser.add_argument(
        "--format",
        default="txt",
        metavar="FMT",
        help=f"one of {', '.join(FORMATS)}, or a comma list (default: txt)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="write the outputs here (default: next to each input)",
    )
    parser.add_argument("--language", metavar="X", help="ISO-639-1 code or name; default auto")
    parser.add_argument(
        "--server",
        metavar="URL",
        help="send the files to this running server (OpenAI-compatible) instead "
        "of transcribing in this process",
    )
    parser.add_argument(
        "--api-key",
        dest="api_key",
        metavar="K",
        default=argparse.SUPPRESS,
        help="the server's API key (default: API_KEY, then OPENAI_API_KEY)",
    )
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="files at a time")
    parser.add_argument(
        "--multichannel",
        action="store_true",
        help="one speaker per channel (2-8): each channel on its own, merged by time",
    )
    parser.add_argument(
        "--channel-names",
        dest="channel_names",
        metavar="A,B",
        help="with --multichannel: the channels' names, in order (default: channel 0, ...)",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="transcribe files whose outputs already exist"
    )


def parse_formats(value: str) -> list[str]:
    """`txt` or `srt,vtt`; an unknown name exits 2 with one line, before anything runs."""
    chosen = [f.strip() for f in value.split(",") if f.strip()]
    unknown = [f for f in chosen if f not in FORMATS] or ([] if chosen else [repr(value)])
    if unknown:
        print(
            f"qwen3-asr-server transcribe: unknown format {', '.join(unknown)}; use "
            f"{', '.join(FORMATS)} (or a comma list)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return list(dict.fromkeys(chosen))


def collect(paths: list[Path], formats: list[str], out: Path | None) -> list[Job]:
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.iterdir() if p.suffix.lower() in AUDIO_SUFFIXES)
        else:
            files.append(path)  # a missing file fails alone, with its reason
    jobs = []
    for file in dict.fromkeys(files):
        folder = out if out is not None else file.parent
        outputs = {f: folder / (file.stem + FORMATS[f][1]) for f in formats}
        jobs.append(Job(file, outputs))
    return jobs


def clashes(jobs: list[Job]) -> list[str]:
    """Outputs that two inputs would both write (`talk.flac` and `talk.wav`, or same-named
    files of two folders with --out): one line each."""
    owner: dict[Path, Path] = {}
    found = []
    for job in jobs:
        for target in job.outputs.values():
            first = owner.setdefault(target.resolve(), job.path)
            if first != job.path:
                found.append(f"{first} and {job.path} would both write {target}")
    return found


def write_atomically(target: Path, body: bytes) -> None:
    """Never a half-written output that a later run would skip."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.part")
    partial.write_bytes(body)
    partial.replace(target)


def error_text(exc: BaseException) -> str:
    message = getattr(exc, "message", None)
    body = getattr(exc, "body", None)
    if isinstance(body, dict) and isinstance(body.get("error"), dict):  # openai SDK errors
        message = body["error"].get("message") or message
    status = getattr(exc, "status_code", None)
    text = str(message or exc) or type(exc).__name__
    return f"HTTP {status}: {text}" if status else text


# -- the run ---------------------------------------------------------------------------------------
async def run_jobs(
    backend: Local | Remote, jobs: list[Job], language: str | None, parallel: int, console: Console
) -> None:
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.total:.0f} s of audio"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, disable=not console.is_terminal) as bars:
        overall = bars.add_task("all files", total=max(1.0, sum(j.seconds for j in jobs)))
        gate = asyncio.Semaphore(max(1, parallel))

        async def one(job: Job) -> None:
            async with gate:
                task = bars.add_task(job.path.name, total=max(job.seconds, 0.1))
                counted = 0.0

                def progress(seconds: float) -> None:
                    nonlocal counted
                    bars.update(task, completed=seconds)
                    bars.advance(overall, max(0.0, seconds - counted))
                    counted = max(counted, seconds)

                try:
                    formats = list(job.outputs)  # those not written yet
                    bodies = await backend.transcribe(job, formats, language, progress)
                    for fmt, body in bodies.items():
                        await asyncio.to_thread(write_atomically, job.outputs[fmt], body)
                        job.written.append(job.outputs[fmt])
                    progress(job.seconds)
                    names = ", ".join(p.name for p in job.written)
                    console.print(f"done    {job.path} -> {names}", highlight=False)
                except Exception as exc:
                    job.error = error_text(exc)
                    console.print(f"FAILED  {job.path}: {job.error}", highlight=False)
                finally:
                    bars.remove_task(task)

        await asyncio.gather(*(one(job) for job in jobs))


def probe(job: Job) -> None:
    from ..audio.decode import probe_seconds

    try:
        with job.path.open("rb") as f:
            job.seconds = probe_seconds(f, filename=job.path.name) or 0.0
    except OSError:
        job.seconds = 0.0


def transcribe(settings: Settings, args: argparse.Namespace) -> int:
    formats = parse_formats(args.format)
    jobs = collect(args.paths, formats, args.out)
    if not jobs:
        print("qwen3-asr-server transcribe: no audio files found")
        return 2
    clashing = clashes(jobs)
    if clashing:  # refused before anything runs: one output would overwrite another
        for line in clashing:
            print(f"qwen3-asr-server transcribe: {line}", file=sys.stderr)
        print("transcribe them in separate runs, or into different --out folders", file=sys.stderr)
        return 2
    for job in jobs:
        if not args.overwrite:
            job.outputs = {f: p for f, p in job.outputs.items() if not p.exists()}
    todo = [j for j in jobs if j.outputs]
    skipped = len(jobs) - len(todo)
    if args.channel_names and not args.multichannel:
        print("qwen3-asr-server transcribe: --channel-names needs --multichannel", file=sys.stderr)
        return 2
    names = [n.strip() for n in args.channel_names.split(",")] if args.channel_names else None
    calls = Calls(names) if args.multichannel else None
    from rich.console import Console

    console = Console(stderr=True, soft_wrap=True)
    started = time.perf_counter()
    if todo:
        for job in todo:
            probe(job)
        if args.server:
            # --api-key, else API_KEY, else OPENAI_API_KEY (both also from .env)
            key = settings.api_key or settings.openai_api_key
            backend: Local | Remote = Remote(args.server, key, settings.model_id, calls)
        else:
            from ..logging import setup_logging

            explicit = "log_level" in settings.model_fields_set  # else only warnings
            setup_logging(settings.log_level if explicit else "WARNING", settings.log_json)
            backend = Local(settings, calls)

        async def main() -> None:
            async with backend:
                await run_jobs(backend, todo, args.language, args.jobs, console)

        asyncio.run(main())
    failed = [j for j in todo if j.error]
    audio = sum(j.seconds for j in todo if not j.error)
    print(
        f"{len(todo) - len(failed)} transcribed, {skipped} skipped (outputs exist), "
        f"{len(failed)} failed; {audio:.1f} s of audio in {time.perf_counter() - started:.1f} s"
    )
    return 1 if failed else 0
