"""`.env.example` lists every setting with its default and docstring, in step with Settings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import make_env_example
from qwen3_asr_server.config import Settings

EXAMPLE = Path(__file__).resolve().parent.parent / ".env.example"
FIX = "run `.venv/bin/python scripts/make_env_example.py` and commit .env.example"
LINE = re.compile(r"^# ([A-Z][A-Z0-9_]*)=(.*)$")


def example_values() -> dict[str, str]:
    values: dict[str, str] = {}
    for line in EXAMPLE.read_text().splitlines():
        m = LINE.match(line)
        if m:
            assert m.group(1) not in values, f"{m.group(1)} listed twice"
            values[m.group(1)] = m.group(2)
    return values


def test_every_setting_is_listed_and_nothing_else() -> None:
    listed = set(example_values())
    fields = {name.upper() for name in Settings.model_fields}
    assert listed == fields, (
        f"missing {sorted(fields - listed)}, stale {sorted(listed - fields)}: {FIX}"
    )


def test_listed_defaults_are_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each value, read back through Settings from the environment, is the field's default."""
    for name in Settings.model_fields:
        monkeypatch.delenv(name.upper(), raising=False)
    values = example_values()
    for env, value in values.items():
        if value != "":  # an empty line stands for "unset" (a None default)
            monkeypatch.setenv(env, value)
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    wrong = {
        name.upper(): (values.get(name.upper()), field.default)
        for name, field in Settings.model_fields.items()
        if getattr(settings, name) != field.default
        or (values.get(name.upper()) == "") != (field.default is None)
    }
    assert wrong == {}, f"listed value vs default: {wrong}; {FIX}"


def test_every_setting_has_its_docstring() -> None:
    docs = make_env_example.field_docs()
    undocumented = [n.upper() for n in Settings.model_fields if not docs.get(n)]
    assert undocumented == [], "add a docstring under each field in config.py"
    text = EXAMPLE.read_text()
    for name, doc in docs.items():
        first = doc.split("\n")[0]
        assert f"# {first}" in text, f"{name.upper()}'s docstring is not in .env.example: {FIX}"


def test_file_is_what_the_script_writes() -> None:
    assert EXAMPLE.read_text() == make_env_example.render(), f".env.example is stale: {FIX}"
