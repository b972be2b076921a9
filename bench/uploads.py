"""Uploads under load (issue 19), against a real server process (whisper-tiny.en):

- leave: 3 clients upload the 2-minute clip and give up after 2 s. Engine calls made after
  they left, and how long until the server is idle.
- memory: 12 concurrent uploads of a quiet 1-hour FLAC. Peak RSS, status codes, time.

    .venv/bin/python bench/uploads.py [--only leave,memory] [--budget S] [--patience S]

Run it against another checkout with PYTHONPATH=OTHER/src for before/after figures (with
--patience 60 there: a server without the budget would take hours to finish all twelve).
Figures go to docs/RELIABILITY.md.
"""

from __future__ import annotations

import argparse
import logging

from common import pct

import httpx

import speech
from proc import ServerProcess
from upload_load import leave_early, many_big, quiet_flac, vm


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="leave,memory")
    parser.add_argument("--budget", help="MAX_PENDING_AUDIO_SECONDS (default: the server's)")
    parser.add_argument("--patience", type=float, help="memory: clients give up after (s)")
    args = parser.parse_args()
    env = {"MODEL_ID": "whisper-tiny.en", "LOG_LEVEL": "WARNING", "PRELOAD": "true"}
    if args.budget:
        env["MAX_PENDING_AUDIO_SECONDS"] = args.budget
    server = ServerProcess(env)
    try:
        server.wait_healthy(60)
        if "leave" in args.only:
            runs = [leave_early(server.url) for _ in range(3)]
            for r in runs:
                print(
                    f"3 clients leave after 2 s: {r['calls_before_leaving']:.0f} engine calls "
                    f"before, {r['calls_after_leaving']:.0f} after "
                    f"({r['segments_after_leaving']:.0f} segments); idle "
                    f"{r['idle_after_s']:.2f} s after they left"
                )
            print(f"idle after p50 {pct([r['idle_after_s'] for r in runs], 50):.2f} s")
        if "memory" in args.only:
            clip = speech.path("long_2min.wav").read_bytes()
            httpx.post(server.url + "/v1/audio/transcriptions", files={"file": clip}, timeout=600)
            print(f"the model's peak while it works: {vm(server.proc.pid, 'VmHWM'):.0f} MB")
            data = quiet_flac()
            result = many_big(server.url, server.proc.pid, data, patience=args.patience)
            print("12 x 1-hour quiet FLAC:", result)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
