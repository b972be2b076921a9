"""Third-party clients against a real server (issue 18): the OpenAI Node SDK (HTTP and both
realtime clients, over TLS), the Vercel AI SDK (whisper and the tiny Qwen checkpoint) and
LiteLLM's Python SDK. `make clients` installs them (tests/clients/); each runs as its own
process and prints what it got as JSON."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import soxr
import trustme

import speech
from helpers import whisper_settings
from proc import ServerProcess
from qwen3_asr_server.app import create_app
from server import LiveServer, live_server
from streaming_client import pcm16
from wer import wer

pytestmark = pytest.mark.slow

CLIENTS = Path(__file__).parent / "clients"
LITELLM_PYTHON = CLIENTS / ".venv-litellm" / "bin" / "python"
KEY = "client-suite-key"
SENTENCE = "sentence_02.wav"


def sentence() -> tuple[str, str]:
    """(name, transcript) of one committed clip."""
    return SENTENCE, speech.sentences()[SENTENCE]


@pytest.fixture(scope="module")
def installed() -> None:
    missing = [
        p for p in (CLIENTS / "node_modules" / ".installed", LITELLM_PYTHON) if not p.exists()
    ]
    if missing:
        pytest.fail(f"the client suite is not installed ({missing[0]}): run `make clients`")


@pytest.fixture(scope="module")
def wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    name, _ = sentence()
    path = tmp_path_factory.mktemp("clients") / "speech.wav"
    path.write_bytes(speech.path(name).read_bytes())
    return path


@pytest.fixture(scope="module")
def whisper_server() -> Iterator[LiveServer]:
    with live_server(create_app(whisper_settings(api_key=KEY))) as srv:
        yield srv


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    """A real `python -m qwen3_asr_server` speaking https/wss with a test CA's certificate."""
    folder = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.private_key_pem.write_to_path(folder / "key.pem")
    cert.cert_chain_pems[0].write_to_path(folder / "cert.pem")
    ca.cert_pem.write_to_path(folder / "ca.pem")
    server = ServerProcess(
        {
            "MODEL_ID": "whisper-tiny.en",
            "API_KEY": KEY,
            "SSL_CERTFILE": str(folder / "cert.pem"),
            "SSL_KEYFILE": str(folder / "key.pem"),
            "LOG_LEVEL": "WARNING",
        }
    )
    server.url = server.url.replace("http://", "https://")
    try:
        deadline_health(server, folder / "ca.pem")
        yield server, folder / "ca.pem"
    finally:
        server.stop()


def deadline_health(server: ServerProcess, ca: Path) -> None:
    import time

    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(server.output())
        try:
            if httpx.get(server.url + "/health", verify=str(ca), timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise TimeoutError("the TLS server did not start")


def run(args: list[str], env: dict[str, str], timeout: float = 120) -> dict[str, Any]:
    done = subprocess.run(
        args,
        cwd=CLIENTS,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no result (exit {done.returncode}): {done.stdout}\n{done.stderr}"
    result: dict[str, Any] = json.loads(lines[-1])
    assert "error" not in result, result
    return result


def close(text: str, reference: str) -> bool:
    """Word error rate under 0.35 (wer() takes lists: strings were compared character by
    character, and raised unless both had the same length)."""
    return wer([reference], [text]) < 0.35


def test_close_scores_words() -> None:
    _, reference = sentence()  # "Please call me back when you get home tonight."
    assert close(reference.rstrip(".").lower(), reference)  # before: ValueError (lengths)
    assert close(reference.replace("tonight", "to night"), reference)
    assert not close("Please call me", reference)


# -- OpenAI Node SDK -------------------------------------------------------------------------
def test_openai_node_sdk_http(installed: None, whisper_server: LiveServer, wav: Path) -> None:
    _, reference = sentence()
    env = {"BASE_URL": whisper_server.url + "/v1", "API_KEY": KEY, "AUDIO": str(wav)}
    out = run(["node", "openai_node.mjs", "http"], env)
    assert close(out["json"]["text"], reference)
    assert close(out["text"], reference)  # the SDK returns the body as a string
    assert out["srt"].startswith("1\n00:00:0") and "-->" in out["srt"]
    assert out["vtt"].startswith("WEBVTT")
    verbose = out["verbose_json"]
    assert verbose["segments"] and all(
        isinstance(s[k], (int, float))
        for s in verbose["segments"]
        for k in ("avg_logprob", "compression_ratio", "no_speech_prob")
    )
    kinds = [e["type"] for e in out["stream"]]
    assert kinds[-1] == "transcript.text.done" and "transcript.text.delta" in kinds
    assert all(e["delta"] for e in out["stream"] if e["type"] == "transcript.text.delta")
    assert close(out["stream"][-1]["text"], reference)


@pytest.mark.parametrize(
    ("client", "node_args"),
    [
        ("realtime-ws", []),  # OpenAIRealtimeWS (the `ws` package, Authorization header)
        ("realtime-browser", ["--experimental-websocket"]),  # browser WebSocket, subprotocols
    ],
)
def test_openai_node_sdk_realtime_over_tls(
    installed: None,
    tls_server: tuple[ServerProcess, Path],
    tmp_path: Path,
    client: str,
    node_args: list[str],
) -> None:
    """Both SDK clients dial wss:// whatever the base URL says: the server speaks TLS itself
    (SSL_CERTFILE/SSL_KEYFILE). Turn detection off: no speech_started, the commit ends it."""
    server, ca = tls_server
    name, reference = sentence()
    samples, _ = sf.read(speech.path(name), dtype="float32")
    audio24k = soxr.resample(samples, 16000, 24000).astype(np.float32)
    pcm = tmp_path / "speech.pcm"
    pcm.write_bytes(pcm16(audio24k))
    env = {
        "BASE_URL": server.url + "/v1",
        "API_KEY": KEY,
        "PCM": str(pcm),
        "NODE_EXTRA_CA_CERTS": str(ca),  # trust the test CA (read at node's start)
    }
    out = run(["node", *node_args, "openai_node.mjs", client], env)
    kinds = [e["type"] for e in out["events"]]
    assert kinds[0] == "session.created"
    assert "input_audio_buffer.speech_started" not in kinds  # turn detection is off
    assert "input_audio_buffer.committed" in kinds
    deltas = [e for e in out["events"] if e["type"].endswith("transcription.delta")]
    assert all(e["delta"] for e in deltas)
    final = out["events"][-1]
    assert final["type"] == "conversation.item.input_audio_transcription.completed"
    assert close(final["transcript"], reference)
    if client == "realtime-browser":
        assert out["protocol"] == "realtime"  # the server echoed the offered subprotocol


def test_openai_node_sdk_realtime_with_a_wrong_key_is_refused(
    installed: None, tls_server: tuple[ServerProcess, Path], tmp_path: Path
) -> None:
    server, ca = tls_server
    pcm = tmp_path / "speech.pcm"
    pcm.write_bytes(b"\0" * 4800)
    env = {
        "BASE_URL": server.url + "/v1",
        "API_KEY": "wrong",
        "PCM": str(pcm),
        "NODE_EXTRA_CA_CERTS": str(ca),
    }
    done = subprocess.run(
        ["node", "--experimental-websocket", "openai_node.mjs", "realtime-browser"],
        cwd=CLIENTS,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "API key" in done.stdout, done.stdout


# -- Vercel AI SDK ---------------------------------------------------------------------------
def vercel(server_url: str, wav: Path) -> dict[str, Any]:
    env = {"BASE_URL": server_url + "/v1", "API_KEY": KEY, "AUDIO": str(wav)}
    return run(["node", "vercel_ai.mjs"], env)


def test_vercel_ai_sdk_transcribe_on_whisper(
    installed: None, whisper_server: LiveServer, wav: Path
) -> None:
    _, reference = sentence()
    out = vercel(whisper_server.url, wav)
    assert close(out["plain"]["text"], reference)
    assert close(out["with_options"]["text"], reference)
    assert out["with_options"]["segments"]  # verbose_json, validated by the SDK's schema
    assert out["with_options"]["durationInSeconds"] > 1


def test_vercel_ai_sdk_transcribe_on_qwen(
    installed: None, qwen_settings: Any, wav: Path, tiny_qwen_dir: Path
) -> None:
    """The tiny checkpoint's text is noise; what matters is that the SDK's strict schema
    accepts the verbose_json the Qwen engine sends (numbers, never null)."""
    with live_server(create_app(qwen_settings(api_key=KEY))) as srv:
        out = vercel(srv.url, wav)
    assert isinstance(out["plain"]["text"], str)
    assert isinstance(out["with_options"]["segments"], list)
    assert out["with_options"]["durationInSeconds"] > 1


# -- LiteLLM -----------------------------------------------------------------------------------
def test_litellm_sdk(installed: None, whisper_server: LiveServer, wav: Path) -> None:
    _, reference = sentence()
    done = subprocess.run(
        [str(LITELLM_PYTHON), "litellm_client.py", whisper_server.url + "/v1", KEY, str(wav)],
        cwd=CLIENTS,
        capture_output=True,
        text=True,
        timeout=180,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, done.stdout + done.stderr
    out = json.loads(lines[-1])
    for name in ("json", "verbose_json", "stream"):
        assert close(out[name]["text"], reference), (name, out)
    assert out["verbose_json"]["segments"] >= 1


# -- what the clients needed from the server ---------------------------------------------------
def test_no_speech_prob_comes_from_the_vad_where_the_engine_has_none() -> None:
    from qwen3_asr_server.audio.vad import SileroModel, fill_no_speech_probs
    from qwen3_asr_server.transcript import Segment

    speech_audio, _ = sf.read(speech.path(SENTENCE), dtype="float32")
    samples = np.concatenate([speech_audio, np.zeros(3 * 16000, np.float32)])
    spoken_end = len(speech_audio) / 16000
    segments = [
        Segment(0.0, spoken_end, "please call me"),
        Segment(spoken_end + 0.5, spoken_end + 2.9, "hallucinated"),
        Segment(0.0, 1.0, "kept", no_speech_prob=0.25),  # the engine's own stays
    ]
    model = SileroModel()
    try:
        fill_no_speech_probs(model, samples, segments)
    finally:
        model.close()
    assert segments[0].no_speech_prob is not None and segments[0].no_speech_prob < 0.2
    assert segments[1].no_speech_prob is not None and segments[1].no_speech_prob > 0.8
    assert segments[2].no_speech_prob == 0.25


def test_qwen_verbose_json_has_numbers_and_a_vad_no_speech_prob(qwen_settings: Any) -> None:
    import httpx

    with live_server(create_app(qwen_settings())) as srv:
        r = httpx.post(
            srv.url + "/v1/audio/transcriptions",
            files={"file": ("a.wav", speech.path(SENTENCE).read_bytes())},
            data={"response_format": "verbose_json"},
            timeout=120,
        )
    assert r.status_code == 200, r.text
    assert r.json()["segments"]
    for s in r.json()["segments"]:
        assert isinstance(s["avg_logprob"], float) and isinstance(s["compression_ratio"], float)
        assert 0.0 <= s["no_speech_prob"] < 0.2  # the VAD heard the speech in it


@pytest.mark.parametrize("response_format", ["srt", "vtt", "verbose_json"])
def test_stream_is_ignored_for_formats_that_cannot_stream(
    whisper_server: LiveServer, response_format: str
) -> None:
    """OpenAI's reference: streaming is ignored for formats that do not support it
    (LiteLLM sends stream=true with verbose_json). Before: 400."""
    import httpx

    r = httpx.post(
        whisper_server.url + "/v1/audio/transcriptions",
        headers={"Authorization": f"Bearer {KEY}"},
        files={"file": ("a.wav", speech.path(SENTENCE).read_bytes())},
        data={"response_format": response_format, "stream": "true"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert "text/event-stream" not in r.headers["content-type"]
    if response_format == "verbose_json":
        assert r.json()["segments"]
    else:
        assert "-->" in r.text


@pytest.mark.parametrize(
    "path", ["/v1/audio/transcriptions", "/v1/audio/translations", "/v1/audio/subtitles"]
)
def test_a_file_part_with_an_empty_filename_is_a_clear_400(
    whisper_server: LiveServer, path: str
) -> None:
    import httpx

    r = httpx.post(
        whisper_server.url + path,
        headers={"Authorization": f"Bearer {KEY}"},
        files={"file": ("", speech.path(SENTENCE).read_bytes(), "audio/wav")},
        timeout=60,
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "file" and "a file is required" in error["message"]
    assert "UploadFile" not in error["message"]  # not Starlette's internals


def test_realtime_sends_no_empty_delta_and_no_vad_events_without_turn_detection() -> None:
    from dataclasses import replace

    from qwen3_asr_server.api.openai.realtime_wire import RealtimeState, to_openai
    from qwen3_asr_server.streaming.events import Partial, SpeechStarted, SpeechStopped
    from qwen3_asr_server.streaming.session import StreamConfig

    state = RealtimeState("sess_x", StreamConfig(use_vad=False), max_seconds=60)
    assert to_openai(SpeechStarted(1, at_ms=0), state) is None
    assert to_openai(SpeechStopped(1, at_ms=900), state) is None
    first = to_openai(Partial(1, "Please call", stable_text="Please"), state)
    assert first is not None and first["delta"] == "Please"
    same = Partial(1, "Please call", stable_text="Please")
    assert to_openai(same, state) is None  # nothing new: no empty delta
    more = to_openai(Partial(1, "Please call", stable_text="Please call"), state)
    assert more is not None and more["delta"] == " call"
    state.config = replace(state.config, use_vad=True)
    started = to_openai(SpeechStarted(2, at_ms=0), state)
    assert started is not None and started["type"] == "input_audio_buffer.speech_started"


def test_tls_settings_need_both_files(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from qwen3_asr_server.config import Settings

    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    with pytest.raises(ValidationError, match="both SSL_CERTFILE and SSL_KEYFILE"):
        Settings(_env_file=None, ssl_certfile=cert)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match=r"SSL_KEYFILE: .* is not a readable file"):
        Settings(_env_file=None, ssl_certfile=cert, ssl_keyfile=tmp_path / "none.pem")  # type: ignore[call-arg]
