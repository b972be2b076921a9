"""The OpenAI contract, checked with the openai SDK's own pydantic types (`model_validate`):
every response format and stream event on both engines (Qwen tiny checkpoint, whisper with
real speech), and a full queue refusing uploads before they are decoded."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import speech
from audio_files import wav_bytes
from contract import check_error, check_stream, check_transcription
from engines import Recording
from helpers import whisper_settings
from qwen3_asr_server.api import uploads
from qwen3_asr_server.app import create_app
from qwen3_asr_server.config import Settings
from qwen3_asr_server.engines import create_engine
from qwen3_asr_server.outputs.formats import compression_ratio
from server import LiveServer, live_server

pytestmark = pytest.mark.slow

CLIP = "three_sentences.wav"


@pytest.fixture(scope="module", params=["qwen", "whisper"])
def server(request: pytest.FixtureRequest, tiny_qwen_dir: Path) -> Iterator[LiveServer]:
    if request.param == "qwen":
        settings = Settings(  # type: ignore[call-arg]
            _env_file=None, model_id=str(tiny_qwen_dir), max_new_tokens=8, idle_timeout=0
        )
    else:
        settings = whisper_settings()
    with live_server(create_app(settings)) as srv:
        yield srv


def post(srv: LiveServer, path: str = "/v1/audio/transcriptions", **data: str) -> httpx.Response:
    return httpx.post(
        srv.url + path,
        files={"file": (CLIP, speech.path(CLIP).read_bytes())},
        data=data,
        timeout=120,
    )


def test_json_is_an_openai_transcription(server: LiveServer) -> None:
    response = post(server, language="en")
    assert response.status_code == 200
    result = check_transcription(response.json())
    if server.ctx.manager.engine.name == "qwen":  # Qwen counts its tokens (issue 31)
        assert result.usage.type == "tokens" and result.usage.input_tokens > 0
    else:
        assert result.usage.type == "duration" and result.usage.seconds >= 1
    assert result.language == "English"  # type: ignore[attr-defined]  # the seed's extra field


def test_verbose_json_is_an_openai_transcription_verbose(server: LiveServer) -> None:
    response = post(server, response_format="verbose_json", **{"timestamp_granularities[]": "word"})
    verbose = check_transcription(response.json(), "verbose_json")
    assert verbose.segments and verbose.words
    assert verbose.usage is not None and verbose.usage.type == "duration"
    for segment in verbose.segments:
        assert segment.temperature == 0.0
        assert segment.compression_ratio >= 0
    if server.ctx.manager.engine.name == "qwen":  # no scores from Qwen: the stand-ins
        for segment in verbose.segments:
            assert (segment.avg_logprob, segment.no_speech_prob) == (0.0, 0.0)
            assert segment.compression_ratio == compression_ratio(segment.text)
    else:  # whisper's own scores pass through
        assert any(segment.avg_logprob < 0 for segment in verbose.segments)
        assert verbose.language == "english"


def test_the_sdk_parses_every_format(server: LiveServer) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    audio = speech.path(CLIP).read_bytes()
    for response_format in ("text", "srt", "vtt"):
        body = client.audio.transcriptions.create(
            model="whisper-1", file=(CLIP, audio), response_format=response_format
        )
        assert isinstance(body, str) and not body.startswith("{")
    raw = client.audio.transcriptions.with_raw_response.create(
        model="whisper-1", file=(CLIP, audio), response_format="verbose_json"
    )
    assert raw.parse().text == check_transcription(raw.http_response.json(), "verbose_json").text


def test_stream_events_are_openai_stream_events(server: LiveServer) -> None:
    response = post(server, stream="true")
    assert response.headers["content-type"].startswith("text/event-stream")
    events = check_stream(response.text)
    assert events[-1].text == "".join(e.delta for e in events[:-1])


def test_every_error_is_openai_shaped(server: LiveServer) -> None:
    checks: list[tuple[httpx.Response, int, str | None]] = [
        (post(server, language="xx"), 400, "language"),
        (post(server, response_format="docx"), 400, "response_format"),
        (post(server, "/v1/audio/transcriptions/stream", temperature="7"), 400, "temperature"),
        (httpx.post(server.url + "/v1/audio/transcriptions", data={"model": "m"}), 400, "file"),
        (httpx.get(server.url + "/v1/models/nope"), 404, "model"),
    ]
    for response, status, param in checks:
        assert response.status_code == status, response.text
        assert check_error(response.json())["param"] == param
        assert response.headers["x-request-id"]


SettingsFactory = Callable[..., Settings]


def test_a_full_queue_refuses_uploads_before_decoding(
    qwen_settings: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded: list[int] = []
    real_decode = uploads.decode_audio

    def counting_decode(source: Any, **kw: Any) -> Any:
        decoded.append(1)
        return real_decode(source, **kw)

    monkeypatch.setattr(uploads, "decode_audio", counting_decode)
    settings = qwen_settings(max_queue=1)
    engine = Recording(create_engine(settings))
    with live_server(create_app(settings, engine=engine)) as srv:  # type: ignore[arg-type]
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        client.audio.transcriptions.create(model="whisper-1", file=("a.wav", wav_bytes(0.5)))
        engine.delay = 2.0
        results: list[Any] = []

        def upload() -> None:
            results.append(
                client.audio.transcriptions.create(
                    model="whisper-1", file=("a.wav", wav_bytes(0.5))
                )
            )

        threads = [threading.Thread(target=upload) for _ in range(2)]
        threads[0].start()  # runs
        deadline = time.monotonic() + 30
        while not srv.ctx.scheduler.busy and time.monotonic() < deadline:
            time.sleep(0.02)
        threads[1].start()  # waits in the queue
        while srv.ctx.scheduler.depth < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert srv.ctx.scheduler.depth == 1
        before = len(decoded)
        garbage = bytes(range(256)) * 16  # would be a 400 invalid_audio if it were decoded
        for path in (
            "/v1/audio/transcriptions",
            "/v1/audio/transcriptions/stream",
            "/v1/audio/subtitles",
        ):
            response = httpx.post(srv.url + path, files={"file": ("a.mp3", garbage)}, timeout=30)
            assert response.status_code == 503, (path, response.text)
            assert response.headers["retry-after"] == "1"
            assert check_error(response.json())["code"] == "queue_full"
        assert len(decoded) == before  # refused before decoding
        for t in threads:
            t.join(60)
        assert len(results) == 2
        engine.delay = 0.0
        response = httpx.post(
            srv.url + "/v1/audio/transcriptions", files={"file": ("a.mp3", garbage)}, timeout=30
        )
        assert response.status_code == 400
        assert check_error(response.json())["code"] == "invalid_audio"
        assert len(decoded) == before + 1
