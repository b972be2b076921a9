"""Fixtures for the black-box suite: the target deployment, clients and speech clips.

Environment: E2E_BASE_URL (default http://localhost:8100), E2E_API_KEY (sent as a bearer
token; as `api_key` or a subprotocol on WebSockets), E2E_AUDIO_DIR (clips and a
transcripts.json; default the repository's tests/data/speech), E2E_CLIP (the clip most tests
send), E2E_TIMEOUT (seconds per HTTP request, default 300), E2E_WAIT (seconds a streaming test
waits for an expected message, default 60), E2E_TEST_TIMEOUT (per test, with pytest-timeout).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from e2e_support import API_KEY, AUDIO_DIR, BASE_URL, TIMEOUT, Clip, auth_headers, load_clips

TEST_TIMEOUT = float(os.environ.get("E2E_TEST_TIMEOUT") or 600)
PREFERRED_CLIP = "sentence_02.wav"
MULTI_CLIP = "three_sentences.wav"  # three sentences with 1 s pauses


def pytest_report_header(config: pytest.Config) -> list[str]:
    key = "set" if API_KEY else "not set (auth tests skipped)"
    return [f"e2e target: {BASE_URL}  API key: {key}  audio: {AUDIO_DIR}"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A per-test ceiling when pytest-timeout is installed (and no --timeout was given), so a
    hung deployment fails a test instead of hanging the run."""
    if not config.pluginmanager.hasplugin("timeout") or config.getoption("timeout", None):
        return
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT))


@pytest.fixture(scope="session", autouse=True)
def health() -> dict[str, Any]:
    """GET /health once; stop the whole run with one clear message if nothing answers."""
    try:
        response = httpx.get(BASE_URL + "/health", timeout=30)
    except httpx.HTTPError as exc:
        pytest.exit(
            f"No server at {BASE_URL} ({exc!r}). Start one (docker compose up -d, make run) "
            "or point E2E_BASE_URL at it.",
            returncode=3,
        )
    if response.status_code != 200:
        pytest.exit(
            f"{BASE_URL}/health answered {response.status_code}: {response.text[:300]}",
            returncode=3,
        )
    return dict(response.json())


@pytest.fixture(scope="session")
def http() -> Iterator[httpx.Client]:
    """httpx against the deployment, with the API key when one is configured."""
    timeout = httpx.Timeout(TIMEOUT, connect=30)
    with httpx.Client(base_url=BASE_URL, headers=auth_headers(), timeout=timeout) as client:
        yield client


@pytest.fixture(scope="session")
def anon() -> Iterator[httpx.Client]:
    """httpx without any API key."""
    with httpx.Client(base_url=BASE_URL, timeout=httpx.Timeout(TIMEOUT, connect=30)) as client:
        yield client


@pytest.fixture(scope="session")
def oai() -> openai.OpenAI:
    """The OpenAI SDK pointed at the deployment (no retries: a failure shows as it is)."""
    return openai.OpenAI(
        base_url=BASE_URL + "/v1", api_key=API_KEY or "unused", max_retries=0, timeout=TIMEOUT
    )


@pytest.fixture(scope="session")
def clips() -> dict[str, Clip]:
    found = load_clips()
    if not any(c.transcript.strip() for c in found.values()):
        pytest.exit(f"No speech clips with transcripts in {AUDIO_DIR}", returncode=3)
    return found


@pytest.fixture(scope="session")
def speech(clips: dict[str, Clip]) -> list[Clip]:
    """Every short clip with speech (under 20 s), for corpus accuracy."""
    short = [c for c in clips.values() if c.transcript.strip() and not c.duration > 20]
    if not short:
        pytest.skip("no clip with speech under 20 s")
    return short


@pytest.fixture(scope="session")
def clip(clips: dict[str, Clip], speech: list[Clip]) -> Clip:
    """The clip most tests send: E2E_CLIP, else sentence_02.wav, else the first short one."""
    name = os.environ.get("E2E_CLIP") or PREFERRED_CLIP
    return clips.get(name) or speech[0]


@pytest.fixture(scope="session")
def multi_clip(clips: dict[str, Clip]) -> Clip:
    """Several sentences separated by pauses (several utterances when streamed)."""
    if MULTI_CLIP not in clips:
        pytest.skip(f"{MULTI_CLIP} is not in {AUDIO_DIR}")
    return clips[MULTI_CLIP]


@pytest.fixture(scope="session")
def long_clip(clips: dict[str, Clip]) -> Clip:
    """The longest clip of a minute or more (it is cut into several segments)."""
    long = [c for c in clips.values() if c.transcript.strip() and c.duration >= 60]
    if not long:
        pytest.skip(f"no clip of 60 s or more in {AUDIO_DIR}")
    return max(long, key=lambda c: c.duration)


@pytest.fixture(scope="session")
def warm(http: httpx.Client, clip: Clip) -> None:
    """One transcription before the streaming tests, so that their waits do not include
    loading the model (the first request loads it)."""
    response = http.post("/v1/audio/transcriptions", files={"file": (clip.name, clip.data)})
    assert response.status_code == 200, response.text
