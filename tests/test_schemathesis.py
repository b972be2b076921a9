"""schemathesis against every route, in its own pytest process (see tests/fuzz_openapi.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_openapi_fuzzing_finds_no_undocumented_response() -> None:
    suite = Path(__file__).with_name("fuzz_openapi.py")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:logging",
            str(suite),
        ],
        cwd=suite.parent.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
