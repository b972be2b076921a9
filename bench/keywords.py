"""keywords[] (issue 31): do names come out right with and without keywords, and what happens
to the word error rate? The rare-name clips are committed espeak-ng speech
(tests/data/speech/names_*.wav, names.json; scripts/make_speech_fixtures.py --names).

    .venv/bin/python bench/keywords.py [--model whisper-tiny.en]

Prints, per clip, the text without and with its keywords, then the share of keyword phrases
written exactly (case-insensitive) and the WER over all clips, both ways. A server with the
model runs as its own process; each clip is sent once each way (greedy decoding: repeatable).
"""

from __future__ import annotations

import argparse
import json
import logging

from common import ROOT

import httpx

from proc import ServerProcess
from wer import wer

DATA = ROOT / "tests" / "data" / "speech"


def transcribe(url: str, name: str, keywords: list[str]) -> str:
    response = httpx.post(
        f"{url}/v1/audio/transcriptions",
        files={"file": (name, (DATA / name).read_bytes())},
        data={"model": "gpt-transcribe", "keywords[]": keywords},
        timeout=600,
    )
    response.raise_for_status()
    return str(response.json()["text"])


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="whisper-tiny.en")
    args = parser.parse_args()
    clips = json.loads((DATA / "names.json").read_text())
    server = ServerProcess({"MODEL_ID": args.model, "LOG_LEVEL": "WARNING"})
    try:
        server.wait_healthy()
        refs, plain, biased = [], [], []
        hits = {"without": 0, "with": 0}
        phrases = 0
        for name, clip in clips.items():
            without = transcribe(server.url, name, [])
            with_ = transcribe(server.url, name, clip["keywords"])
            refs.append(clip["text"])
            plain.append(without)
            biased.append(with_)
            for phrase in clip["keywords"]:
                phrases += 1
                hits["without"] += phrase.lower() in without.lower()
                hits["with"] += phrase.lower() in with_.lower()
            print(f"{name}: keywords {clip['keywords']}")
            print(f"    without: {without}")
            print(f"    with:    {with_}")
        print(
            f"{args.model}: keyword phrases written exactly: without {hits['without']}/{phrases}, "
            f"with {hits['with']}/{phrases}; WER without {wer(refs, plain):.3f}, "
            f"with {wer(refs, biased):.3f}"
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
