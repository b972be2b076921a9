"""The real process: lazy heavy imports, `python -m`, `.env`, and the log format."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from audio_files import wav_bytes
from proc import ServerProcess

pytestmark = pytest.mark.slow


def post_wav(url: str, **headers: str) -> httpx.Response:
    return httpx.post(
        url + "/v1/audio/transcriptions",
        files={"file": ("a.wav", wav_bytes(1.0))},
        headers=headers,
        timeout=120,
    )


def test_health_answers_without_torch_until_the_first_transcription(
    tiny_qwen_dir: Path,
) -> None:
    server = ServerProcess({"MODEL_ID": str(tiny_qwen_dir), "MAX_NEW_TOKENS": "8"})
    try:
        server.wait_healthy()
        health = httpx.get(server.url + "/health").json()
        assert health["model_loaded"] is False
        assert health["cuda"] is None  # torch not imported, so no CUDA facts
        assert not server.torch_loaded()
        assert post_wav(server.url).status_code == 200
        assert server.torch_loaded()  # proves the check above can fail
        health = httpx.get(server.url + "/health").json()
        assert health["model_loaded"] is True
        assert health["device"] == "cpu"
        assert health["cuda"] is False
    finally:
        server.stop()


def test_env_file_and_json_logs_with_request_id(tiny_qwen_dir: Path, tmp_path: Path) -> None:
    (tmp_path / ".env").write_text(
        f"MODEL_ID={tiny_qwen_dir}\nMAX_NEW_TOKENS=8\nLOG_JSON=true\nIDLE_TIMEOUT=0.5\n"
    )
    server = ServerProcess({}, cwd=tmp_path)
    try:
        server.wait_healthy()
        assert httpx.get(server.url + "/health").json()["model_id"] == str(tiny_qwen_dir)
        assert post_wav(server.url, **{"X-Request-ID": "req-42"}).status_code == 200
        assert httpx.get(server.url + "/health").json()["model_loaded"] is True
        for _ in range(100):  # IDLE_TIMEOUT=0.5: the watchdog unloads it
            if not httpx.get(server.url + "/health").json()["model_loaded"]:
                break
            __import__("time").sleep(0.1)
        assert httpx.get(server.url + "/health").json()["model_loaded"] is False
    finally:
        output = server.output()
    records = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert records, output
    tagged = [r for r in records if r["record"]["extra"].get("request_id") == "req-42"]
    messages = " ".join(r["record"]["message"] for r in tagged)
    assert "loading qwen model" in messages
    assert "POST /v1/audio/transcriptions" in messages  # uvicorn's access log, intercepted
    assert any("unloading the model" in r["record"]["message"] for r in records)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"ENGINE": "remote"}, "ENGINE=remote needs REMOTE_BACKENDS"),
        ({"ENGINE": "remote", "REMOTE_BACKENDS": "gpu-a:8000"}, "not an http(s) URL"),
        ({"PORT": "eighty"}, "PORT: Input should be a valid integer"),
    ],
)
def test_a_bad_setting_is_one_line_and_exit_2(
    tmp_path: Path, env: dict[str, str], expected: str
) -> None:
    server = ServerProcess(env, cwd=tmp_path)
    server.proc.wait(30)
    output = server.output()
    assert server.proc.returncode == 2
    assert expected in output and "Traceback" not in output, output
