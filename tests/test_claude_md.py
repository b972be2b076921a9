"""CLAUDE.md stays true: every path it names exists and every `make` target it names is in
the Makefile."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "qwen3_asr_server"


def test_every_path_and_command_in_claude_md_exists() -> None:
    text = (ROOT / "CLAUDE.md").read_text()
    spans = re.findall(r"`([^`]+)`", text)
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", (ROOT / "Makefile").read_text(), re.M))
    checked = 0
    for span in spans:
        for target in re.findall(r"\bmake ([a-z0-9-]+)", span):
            assert target in targets, f"CLAUDE.md names `make {target}`, not in the Makefile"
            checked += 1
        if (
            " " in span
            or span.startswith("/")
            or not re.search(r"/|\.(py|md|toml|yml|example)$", span)
        ):
            continue
        path = span.rstrip("/")
        candidates = [ROOT / path, PACKAGE / path]
        assert any(c.exists() for c in candidates), f"CLAUDE.md names {span!r}, which is missing"
        checked += 1
    assert checked >= 20
