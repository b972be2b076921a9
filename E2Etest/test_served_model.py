"""Which model answers, said everywhere (issue 33): /health and /v1/models name the served
model and, when the bundled model serves instead of the default one, a `fallback` object
(`wanted`, `reason`); every transcription names its model in `X-Model-ID`; a model still being
downloaded is a 503 `model_downloading` with Retry-After, never a wait."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from e2e_support import Clip

pytestmark = pytest.mark.http


@pytest.mark.smoke
def test_the_served_model_and_any_fallback_are_said(
    http: httpx.Client, health: dict[str, Any], clip: Clip
) -> None:
    fallback = health.get("fallback")
    if fallback is not None:  # announced: the wanted model and why not
        assert fallback["wanted"] and fallback["reason"], fallback
        served = http.get("/v1/models").json()["data"][0]
        assert served["id"] == health["model_id"] and served["fallback"] == fallback
    response = http.post("/v1/audio/transcriptions", files={"file": (clip.name, clip.data)})
    if response.status_code == 503 and "model_downloading" in response.text:
        assert int(response.headers["Retry-After"]) >= 1
        assert http.get("/health").json()["download"]["bytes_total"] >= 0
        pytest.skip("the model is still downloading")
    assert response.status_code == 200, response.text
    assert response.headers["X-Model-ID"] == http.get("/health").json()["model_id"]
