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


def test_the_map_names_every_wing_and_module() -> None:
    """CLAUDE.md's map has a line for every wing and every module of the package (a wing's
    `__init__.py` only where it holds code)."""
    text = (ROOT / "CLAUDE.md").read_text()
    named = set(re.findall(r"`([^`\s]+)`", text))
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name == "__init__.py" and len(path.read_text().splitlines()) <= 3:
            continue  # a wing's docstring
        if rel not in named:
            missing.append(rel)
    wings = {p.name + "/" for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    missing += sorted(wings - named)
    assert missing == [], f"CLAUDE.md's map lacks {missing}"
