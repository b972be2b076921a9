"""LiteLLM's Python SDK against a running server; prints one JSON object with what it got.

Run with the separate venv `make clients` builds (LiteLLM pins an older openai SDK than the
tests use): tests/clients/.venv-litellm/bin/python litellm_client.py BASE_URL API_KEY WAV
"""

from __future__ import annotations

import json
import sys

import litellm


def main() -> None:
    base_url, api_key, wav = sys.argv[1:4]
    common = {"model": "openai/whisper-1", "api_base": base_url, "api_key": api_key}
    out = {}
    for name, extra in {
        "json": {},
        "verbose_json": {"response_format": "verbose_json"},
        "stream": {"stream": True},
    }.items():
        with open(wav, "rb") as f:
            result = litellm.transcription(file=f, **common, **extra)
        out[name] = {"text": result.text, "type": type(result).__name__}
        segments = getattr(result, "segments", None)
        if segments is not None:
            out[name]["segments"] = len(segments)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
