"""The committed espeak-ng speech fixtures (scripts/make_speech_fixtures.py)."""

from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "speech"


def transcripts() -> dict[str, str]:
    return dict(json.loads((DATA / "transcripts.json").read_text()))


def sentences() -> dict[str, str]:
    return {k: v for k, v in transcripts().items() if k.startswith("sentence_")}


def path(name: str) -> Path:
    return DATA / name
