"""Small shared test helpers."""

from __future__ import annotations

from qwen3_asr_server.config import Settings


def whisper_settings(**overrides: object) -> Settings:
    """Settings for a server on the bundled whisper-tiny.en model (no .env file is read)."""
    # no diarizer child beside a preloaded model unless a test asks (DIARIZE_PRELOAD)
    values: dict[str, object] = {
        "model_id": "whisper-tiny.en",
        "idle_timeout": 0,
        "diarize_preload": False,
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)  # type: ignore[arg-type]


def tiny_qwen_settings(model_dir: object, **overrides: object) -> Settings:
    """Settings for a server on the tiny Qwen checkpoint in `model_dir` (conftest's
    `tiny_qwen_dir`; the `qwen_settings` fixture's, for module-scoped servers)."""
    values: dict[str, object] = {
        "model_id": str(model_dir),
        "device": "cpu",
        "max_new_tokens": 8,
        "idle_timeout": 0,
        "diarize_preload": False,
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)  # type: ignore[arg-type]
