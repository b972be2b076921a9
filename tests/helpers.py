"""Small shared test helpers."""

from __future__ import annotations

from qwen3_asr_server.config import Settings


def whisper_settings(**overrides: object) -> Settings:
    """Settings for a server on the bundled whisper-tiny.en model (no .env file is read)."""
    values: dict[str, object] = {"model_id": "whisper-tiny.en", "idle_timeout": 0}
    values.update(overrides)
    return Settings(_env_file=None, **values)  # type: ignore[arg-type]
