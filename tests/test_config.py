from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from qwen3_asr_server.config import Settings
from qwen3_asr_server.models.choice import default_model_id

DOCS = Path(__file__).resolve().parent.parent / "docs" / "CONFIGURATION.md"


def test_every_setting_is_documented() -> None:
    text = DOCS.read_text()
    missing = [n.upper() for n in Settings.model_fields if f"`{n.upper()}`" not in text]
    assert missing == []


def test_env_vars_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDLE_TIMEOUT", "0")
    monkeypatch.setenv("MAX_QUEUE", "3")
    monkeypatch.setenv("LOG_JSON", "true")
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.idle_timeout == 0 and settings.max_queue == 3 and settings.log_json


def test_default_model_depends_on_device() -> None:
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert default_model_id(settings, cuda=False) == "Qwen/Qwen3-ASR-0.6B"
    assert default_model_id(settings, cuda=True) == "Qwen/Qwen3-ASR-1.7B"


def test_bad_values_are_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAX_QUEUE", "0")
    with pytest.raises(ValidationError):
        Settings(_env_file=None)  # type: ignore[call-arg]
