"""The OpenAI transcription API on the real Qwen engine (tiny checkpoint), real uvicorn,
real `openai` SDK. The weights are random, so these assert the contract, not the words."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from audio_files import av_bytes, encode_av, quiet_start_speech, wav_bytes
from contract import check_error, check_transcription
from helpers import tiny_qwen_settings
from qwen3_asr_server.app import create_app
from qwen3_asr_server.config import Settings
from qwen3_asr_server.engines import create_engine
from server import LiveServer, live_server

pytestmark = pytest.mark.slow

SettingsFactory = Callable[..., Settings]


def client_for(server: LiveServer, api_key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def server(tiny_qwen_dir: Path) -> Iterator[LiveServer]:
    """One server, default settings, for the tests whose requests leave nothing another
    test asserts on (a test that needs a fresh server's state takes `fresh_server`)."""
    with live_server(create_app(tiny_qwen_settings(tiny_qwen_dir))) as srv:
        yield srv


@pytest.fixture
def fresh_server(qwen_settings: SettingsFactory) -> Iterator[LiveServer]:
    with live_server(create_app(qwen_settings())) as srv:
        yield srv


def transcribe(client: openai.OpenAI, data: bytes, name: str = "a.wav", **kw: Any) -> Any:
    """The SDK's call; a json/verbose_json body is checked against the SDK's own type (the
    SDK itself builds its result without validating it)."""
    raw = client.audio.transcriptions.with_raw_response.create(
        model="whisper-1", file=(name, data), **kw
    )
    response_format = kw.get("response_format", "json")
    if response_format in ("json", "verbose_json"):
        check_transcription(raw.http_response.json(), response_format)
    return raw.parse()


def test_json_response_has_the_documented_fields(server: LiveServer) -> None:
    client = client_for(server)
    raw = client.audio.transcriptions.with_raw_response.create(
        model="whisper-1", file=("a.wav", wav_bytes(2.0)), prompt="Glossary: Qwen."
    )
    assert raw.http_request.headers  # the SDK really sent it
    assert raw.headers["x-request-id"]
    timing = dict(part.strip().split(";dur=") for part in raw.headers["server-timing"].split(","))
    assert set(timing) == {"decode", "queue", "engine"}
    assert float(timing["engine"]) > 0
    body = raw.http_response.json()
    check_transcription(body)
    assert set(body) == {"text", "language", "languages", "duration", "usage"}
    assert isinstance(body["text"], str)
    assert body["duration"] == pytest.approx(2.0, abs=0.01)
    usage = body["usage"]  # Qwen counts tokens (issue 31): 13 audio tokens a second
    assert usage["type"] == "tokens" and usage["input_token_details"]["audio_tokens"] == 26
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert raw.parse().text == body["text"]
    assert server.ctx.manager.loaded


def test_text_response_is_the_plain_body(server: LiveServer) -> None:
    client = client_for(server)
    text = transcribe(client, wav_bytes(1.0), response_format="text")
    assert isinstance(text, str)
    response = httpx.post(
        server.url + "/v1/audio/transcriptions",
        files={"file": ("a.wav", wav_bytes(1.0))},
        data={"response_format": "text"},
        timeout=60,
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert not response.text.startswith("{")


@pytest.mark.parametrize(
    ("language", "reported"),
    [("en", "English"), ("English", "English"), ("zh", "Chinese"), ("fr", "French")],
)
def test_forced_language_forms(server: LiveServer, language: str, reported: str) -> None:
    """json reports the seed's capitalised name; verbose_json OpenAI's lower-case one."""
    client = client_for(server)
    raw = client.audio.transcriptions.with_raw_response.create(
        model="whisper-1", file=("a.wav", wav_bytes(1.0)), language=language
    )
    assert check_transcription(raw.http_response.json()).language == reported
    raw = client.audio.transcriptions.with_raw_response.create(
        model="whisper-1",
        file=("a.wav", wav_bytes(1.0)),
        language=language,
        response_format="verbose_json",
    )
    verbose = check_transcription(raw.http_response.json(), "verbose_json")
    assert verbose.language == reported.lower()


def test_auto_language_is_accepted(server: LiveServer) -> None:
    result = transcribe(client_for(server), wav_bytes(1.0), language="auto")
    assert isinstance(result.text, str)


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("a.flac", None),
        ("a.m4a", "mp4"),
        ("a.webm", "webm"),
    ],
)
def test_containers_through_the_api(server: LiveServer, name: str, data: str | None) -> None:
    if data is None:
        from audio_files import encode, tone

        payload = encode(tone(1.0, 22050, 2), 22050, "FLAC")
    else:
        payload = av_bytes(data, "aac" if data == "mp4" else "libopus")
    raw = client_for(server).audio.transcriptions.with_raw_response.create(
        model="whisper-1", file=(name, payload)
    )
    assert check_transcription(raw.http_response.json()).duration == pytest.approx(1.0, abs=0.15)


def test_raw_pcm_upload(server: LiveServer) -> None:
    pcm = b"\x00\x10" * 16000 * 2  # 2 s of s16le at 16 kHz
    raw = client_for(server).audio.transcriptions.with_raw_response.create(
        model="whisper-1", file=("a.pcm", pcm, "audio/pcm")
    )
    assert check_transcription(raw.http_response.json()).duration == pytest.approx(2.0)


def assert_openai_error(exc: openai.APIStatusError, status: int, param: str | None) -> None:
    assert exc.status_code == status
    error = check_error(exc.response.json())
    assert error["param"] == param
    assert exc.response.headers["x-request-id"]


def test_empty_file_is_400(server: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        transcribe(client_for(server), b"")
    assert_openai_error(info.value, 400, "file")


def test_undecodable_audio_is_400_invalid_audio(server: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        transcribe(client_for(server), bytes(range(256)) * 16, name="a.mp3")
    assert_openai_error(info.value, 400, "file")
    assert info.value.code == "invalid_audio"
    assert "not a supported audio format" in info.value.message


@pytest.mark.parametrize("language", ["xx", "Klingon"])
def test_bad_language_is_400_on_language(server: LiveServer, language: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        transcribe(client_for(server), wav_bytes(0.5), language=language)
    assert_openai_error(info.value, 400, "language")


def test_bad_response_format_and_temperature_are_400(server: LiveServer) -> None:
    client = client_for(server)
    with pytest.raises(openai.BadRequestError) as info:
        transcribe(client, wav_bytes(0.5), response_format="docx")  # type: ignore[arg-type]
    assert_openai_error(info.value, 400, "response_format")
    with pytest.raises(openai.BadRequestError) as info:
        transcribe(client, wav_bytes(0.5), temperature=3.0)
    assert_openai_error(info.value, 400, "temperature")


def test_missing_file_is_400(server: LiveServer) -> None:
    response = httpx.post(server.url + "/v1/audio/transcriptions", data={"model": "x"})
    assert response.status_code == 400
    assert check_error(response.json())["param"] == "file"


def test_upload_too_large_is_413(qwen_settings: SettingsFactory) -> None:
    with live_server(create_app(qwen_settings(max_upload_mb=0.05))) as srv:
        client = client_for(srv)
        # Under the body limit (file limit + multipart slack) but over the file limit.
        with pytest.raises(openai.APIStatusError) as info:
            transcribe(client, wav_bytes(3.0))
        assert_openai_error(info.value, 413, "file")
        # Over the body limit: refused from Content-Length before it is read.
        with pytest.raises(openai.APIStatusError) as info:
            transcribe(client, b"\x00" * 1_200_000)
        assert_openai_error(info.value, 413, "file")
        # the limit named is MAX_UPLOAD_MB's, not the body's (issue 41: "the 1.05 MB limit")
        message = info.value.response.json()["error"]["message"]
        assert "the 0.05 MB limit (MAX_UPLOAD_MB)" in message, message

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted while streaming
            yield b"--x\r\nContent-Disposition: form-data; name=file; filename=a.wav\r\n\r\n"
            for _ in range(40):
                yield b"\x00" * 64_000

        response = httpx.post(
            srv.url + "/v1/audio/transcriptions",
            content=chunks(),
            headers={"content-type": "multipart/form-data; boundary=x"},
        )
        assert response.status_code == 413
        assert check_error(response.json())["code"] == "too_large"


def test_audio_too_long_is_413(qwen_settings: SettingsFactory) -> None:
    with live_server(create_app(qwen_settings(max_audio_seconds=1.0))) as srv:
        with pytest.raises(openai.APIStatusError) as info:
            transcribe(client_for(srv), wav_bytes(2.0))
        assert_openai_error(info.value, 413, "file")
        assert not srv.ctx.manager.loaded  # rejected before the model was needed


def test_audio_whose_header_only_guesses_its_length_is_not_refused(
    qwen_settings: SettingsFactory,
) -> None:
    """issue 41: a 9.3 s raw AAC file after 3 s of silence got 413 "Audio is 283 s long"
    with MAX_AUDIO_SECONDS=10 (FFmpeg's guess from the first frames' bitrate)."""
    data = encode_av(quiet_start_speech(9.3), "adts", "aac")
    with live_server(create_app(qwen_settings(max_audio_seconds=10.0))) as srv:
        result = client_for(srv).audio.transcriptions.create(
            model="x", file=("call.aac", data), response_format="verbose_json"
        )
    assert result.duration == pytest.approx(9.3, abs=0.15)


def test_api_key(qwen_settings: SettingsFactory) -> None:
    with live_server(create_app(qwen_settings(api_key="s3cret"))) as srv:
        with pytest.raises(openai.AuthenticationError) as info:
            transcribe(client_for(srv, api_key="wrong"), wav_bytes(0.5))
        assert_openai_error(info.value, 401, None)
        assert info.value.code == "invalid_api_key"
        missing = httpx.get(srv.url + "/v1/models")
        assert missing.status_code == 401
        check_error(missing.json())
        assert srv.get("/health").status_code == 200  # /health stays open
        result = transcribe(client_for(srv, api_key="s3cret"), wav_bytes(0.5))
        assert isinstance(result.text, str)
        assert [m.id for m in client_for(srv, "s3cret").models.list()][1] == "whisper-1"


def test_models_list_and_health(fresh_server: LiveServer, tiny_qwen_dir: Path) -> None:
    server = fresh_server  # model_loaded and queue_depth of a server nothing has used yet
    models = client_for(server).models.list()
    ids = [m.id for m in models]
    assert ids == [str(tiny_qwen_dir), "whisper-1"]
    assert client_for(server).models.retrieve("whisper-1").id == "whisper-1"
    with pytest.raises(openai.NotFoundError):
        client_for(server).models.retrieve("gpt-9")
    health = server.get("/health").json()
    assert health["status"] == "ok"
    assert health["model_loaded"] is False  # /health never loads it
    assert health["engine"] == "qwen"
    assert health["model_id"] == str(tiny_qwen_dir)
    assert health["queue_depth"] == 0
    assert health["uptime_s"] >= 0


def test_request_id_is_echoed_and_unknown_routes_use_openai_shape(server: LiveServer) -> None:
    response = server.get("/health", headers={"X-Request-ID": "abc-123"})
    assert response.headers["x-request-id"] == "abc-123"
    missing = server.get("/nope")
    assert missing.status_code == 404
    assert check_error(missing.json())["code"] == "not_found"
    assert missing.headers["x-request-id"]
    wrong_method = httpx.get(server.url + "/v1/audio/transcriptions")
    assert wrong_method.status_code == 405
    check_error(wrong_method.json())


def test_failed_load_is_503_with_a_fix_then_recovers(
    qwen_settings: SettingsFactory, tiny_qwen_dir: Path, tmp_path: Path
) -> None:
    later = tmp_path / "model-arrives-later"
    with live_server(create_app(qwen_settings(model_id=str(later)))) as srv:
        client = client_for(srv)
        with pytest.raises(openai.InternalServerError) as info:
            transcribe(client, wav_bytes(0.5))
        assert info.value.status_code == 503
        assert info.value.response.headers["retry-after"]
        check_error(info.value.response.json())
        assert "MODEL_ID" in info.value.message
        assert srv.get("/health").json()["last_load_error"]
        shutil.copytree(tiny_qwen_dir, later)  # the operator fixes it; no restart
        retry_after = int(info.value.response.headers["retry-after"])
        time.sleep(retry_after)  # a client that honours Retry-After: the load is retried
        assert isinstance(transcribe(client, wav_bytes(0.5)).text, str)
        assert srv.ctx.manager.loaded


class SlowFirstCalls:
    """Wraps the real engine; its first `slow` transcriptions wait for `gate` first (the
    test opens it once it has seen what it waits for; `seconds` is only a backstop)."""

    def __init__(self, engine: Any, slow: int, seconds: float = 60.0) -> None:
        self.inner = engine
        self.slow = slow
        self.seconds = seconds
        self.gate = threading.Event()
        self.lock = threading.Lock()
        self.name, self.model_id = engine.name, engine.model_id

    def __getattr__(self, item: str) -> Any:
        return getattr(self.inner, item)

    def _wait(self) -> None:
        with self.lock:
            held = self.slow > 0
            self.slow -= 1
        if held:
            self.gate.wait(self.seconds)

    def transcribe(self, request: Any, should_stop: Any = None) -> Any:
        self._wait()
        if should_stop is None:
            return self.inner.transcribe(request)
        return self.inner.transcribe(request, should_stop)

    def decode_rows(self, source: Any) -> None:
        """Qwen's step loop: slow before its first step (the jobs behind it still wait)."""
        self._wait()
        self.inner.decode_rows(source)


def until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    """Wait for `condition`, not for a guessed time."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the condition"
        time.sleep(0.01)


def test_timeout_is_504_and_the_next_request_succeeds(qwen_settings: SettingsFactory) -> None:
    # the held call cannot finish in time whatever the machine's speed; the others (a 0.5 s
    # clip on the tiny checkpoint: ~0.1 s) have room on a busy one
    settings = qwen_settings(request_timeout=3.0, preload=True)  # a load may take longer
    engine = SlowFirstCalls(create_engine(settings), slow=0)
    with live_server(create_app(settings, engine=engine)) as srv:  # type: ignore[arg-type]
        client = client_for(srv)
        transcribe(client, wav_bytes(0.5), language="en")  # warm: load outside the timeout
        engine.slow = 1
        try:
            with pytest.raises(openai.APIStatusError) as info:
                transcribe(client, wav_bytes(0.5))
            assert_openai_error(info.value, 504, None)
            assert srv.ctx.scheduler.busy  # the held job still runs after its 504
        finally:
            engine.gate.set()
        # the abandoned job finishes (its result is dropped): wait for that, not a guess
        until(lambda: not (srv.ctx.scheduler.busy or srv.ctx.scheduler.depth))
        assert isinstance(transcribe(client, wav_bytes(0.5)).text, str)


def test_queue_full_is_503_with_retry_after(qwen_settings: SettingsFactory) -> None:
    settings = qwen_settings(max_queue=1)
    engine = SlowFirstCalls(create_engine(settings), slow=0)
    with live_server(create_app(settings, engine=engine)) as srv:  # type: ignore[arg-type]
        client = client_for(srv)
        transcribe(client, wav_bytes(0.5))  # load
        engine.slow = 2
        results: list[Any] = []
        threads = [
            threading.Thread(target=lambda: results.append(transcribe(client, wav_bytes(0.5))))
            for _ in range(2)
        ]
        scheduler = srv.ctx.scheduler
        try:
            threads[0].start()
            until(lambda: scheduler.busy)  # one running (held at the gate)
            threads[1].start()
            until(lambda: scheduler.depth == 1)  # one queued
            with pytest.raises(openai.InternalServerError) as info:
                transcribe(client, wav_bytes(0.5))
        finally:
            engine.gate.set()
        assert info.value.status_code == 503
        assert info.value.response.headers["retry-after"] == "1"
        assert check_error(info.value.response.json())["code"] == "queue_full"
        for t in threads:
            t.join(30)
        assert len(results) == 2
