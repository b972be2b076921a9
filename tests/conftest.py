from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "E2Etest"))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))


@pytest.fixture(scope="session")
def tiny_qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight Qwen3-ASR checkpoint, built once per test session."""
    from tiny_qwen import build

    return build(tmp_path_factory.mktemp("tiny-qwen"))


@pytest.fixture
def qwen_settings(tiny_qwen_dir: Path):  # type: ignore[no-untyped-def]
    """Settings factory for a server on the tiny checkpoint (no .env file is read)."""
    from helpers import tiny_qwen_settings
    from qwen3_asr_server.config import Settings

    def make(**overrides: object) -> Settings:
        return tiny_qwen_settings(tiny_qwen_dir, **overrides)

    return make


@pytest.fixture(scope="session")
def tiny_aligner_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight Qwen3-ForcedAligner checkpoint (same architecture, with a
    `<timestamp>` token), loaded through the SDK's real Qwen3ForcedAligner."""
    from tiny_qwen import build

    return build(tmp_path_factory.mktemp("tiny-aligner"), aligner=True)
