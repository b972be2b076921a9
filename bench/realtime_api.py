"""This server alone on the OpenAI Realtime API (issue 15): the 12 sentences at real-time
pace with server VAD (500 ms), through the same client code as bench/compare_speaches.py.

    .venv/bin/python bench/realtime_api.py [--runs 2] [--env KEY=VALUE ...]

Prints end of speech -> final (p50, p95), the first delta after speech starts, and the
share of delta words that disagree with their item's final transcript.
"""

from __future__ import annotations

import argparse
import statistics

from common import pct

import speech
from compare_speaches import start_ours


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE (repeatable)")
    args = parser.parse_args()
    target, _, proc = start_ours(dict(kv.split("=", 1) for kv in args.env))
    try:
        target.transcribe("sentence_01.wav")  # load the model
        names = sorted(speech.sentences())
        finals, firsts, shown, wrong, done = [], [], 0, 0, 0
        for _ in range(args.runs):
            run = target.realtime(names)
            finals += run.final_latencies()
            firsts += run.first_deltas()
            words = run.delta_words()
            shown, wrong, done = shown + words[0], wrong + words[1], done + len(run.completed)
        print(
            f"end of speech -> final: p50 {pct(finals, 50):.3f} s, p95 {pct(finals, 95):.3f} s "
            f"(n={len(finals)}, finals {done}/{len(names) * args.runs}); first delta after "
            f"speech start p50 {statistics.median(firsts):.3f} s; delta words that disagree "
            f"with the final {wrong}/{shown} ({100 * wrong / max(1, shown):.1f}%)"
        )
    finally:
        proc.stop()


if __name__ == "__main__":
    main()
