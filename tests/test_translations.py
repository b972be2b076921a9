"""/v1/audio/translations against a local OpenAI-compatible server with deterministic
replies (tests/fake_llm.py), on the whisper engine with real speech."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import srt
import webvtt

import speech
from contract import check_error, check_translation
from fake_llm import create_fake_llm
from qwen3_asr_server.app import create_app
from qwen3_asr_server.config import Settings
from server import LiveServer, free_port, live_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llm() -> Iterator[LiveServer]:
    with live_server(create_fake_llm()) as srv:
        yield srv


@pytest.fixture(scope="module")
def server(llm: LiveServer) -> Iterator[LiveServer]:
    s = Settings(  # type: ignore[call-arg]
        _env_file=None,
        model_id="whisper-tiny.en",
        idle_timeout=0,
        translate_base_url=llm.url + "/v1",
        translate_model="fake-translator",
        translate_api_key="k",
    )
    with live_server(create_app(s)) as srv:
        yield srv


@pytest.fixture(autouse=True)
def reset(llm: LiveServer) -> None:
    llm.app.state.mode = "ok"
    llm.app.state.calls.clear()


def translate(server: LiveServer, name: str, **data: str) -> httpx.Response:
    return httpx.post(
        server.url + "/v1/audio/translations",
        files={"file": (name, speech.path(name).read_bytes())},
        data=data,
        timeout=120,
    )


def transcript(server: LiveServer, name: str) -> str:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    return client.audio.transcriptions.create(
        model="whisper-1", file=(name, speech.path(name).read_bytes())
    ).text


def test_default_is_english_json_through_the_openai_sdk(server: LiveServer) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    name = "three_sentences.wav"
    raw = client.audio.translations.with_raw_response.create(
        model="whisper-1", file=(name, speech.path(name).read_bytes())
    )
    body = raw.http_response.json()
    assert check_translation(body).text == raw.parse().text
    assert body["text"] == "EN:" + transcript(server, name).upper()
    assert (body["language"], body["source_language"]) == ("english", "english")


def test_seed_language_sets_the_target_and_text_format(server: LiveServer, llm: LiveServer) -> None:
    response = translate(server, "sentence_02.wav", language="zh", response_format="text")
    assert response.headers["content-type"].startswith("text/plain")
    assert response.text.startswith("ZH:PLEASE CALL ME BACK")
    system = llm.app.state.calls[-1]["messages"][0]["content"]
    assert "Simplified Chinese" in system
    assert llm.app.state.calls[-1]["model"] == "fake-translator"


def test_srt_keeps_cue_count_indices_and_timing(server: LiveServer) -> None:
    name = "long_2min.wav"
    original = list(
        srt.parse(
            httpx.post(
                server.url + "/v1/audio/subtitles",
                files={"file": (name, speech.path(name).read_bytes())},
                timeout=120,
            ).text
        )
    )
    response = translate(server, name, response_format="srt")
    assert response.headers["content-disposition"] == (
        'attachment; filename="translated_subtitles.srt"'
    )
    translated = list(srt.parse(response.text))
    assert len(translated) == len(original) > 10
    for a, b in zip(original, translated, strict=True):
        assert (a.index, a.start, a.end) == (b.index, b.start, b.end)
        assert b.content.replace("\n", " ") == "EN:" + a.content.replace("\n", " ").upper()


def test_vtt_translation(server: LiveServer) -> None:
    response = translate(server, "three_sentences.wav", response_format="vtt")
    assert response.headers["content-type"].startswith("text/vtt")
    assert response.headers["content-disposition"] == (
        'attachment; filename="translated_subtitles.vtt"'
    )
    captions = webvtt.from_buffer(io.StringIO(response.text))
    assert len(captions) >= 3 and all(c.text.startswith("EN:") for c in captions)


def test_code_fences_are_stripped(server: LiveServer, llm: LiveServer) -> None:
    llm.app.state.mode = "fenced"
    text = translate(server, "sentence_08.wav", response_format="text").text
    assert text.startswith("EN:LEARNING") and "```" not in text
    cues = list(srt.parse(translate(server, "sentence_08.wav", response_format="srt").text))
    assert cues and all("```" not in c.content for c in cues)


def test_count_mismatch_is_retried_once(server: LiveServer, llm: LiveServer) -> None:
    llm.app.state.mode = "short_once"
    response = translate(server, "three_sentences.wav", response_format="srt")
    assert response.status_code == 200
    assert len(llm.app.state.calls) == 2


@pytest.mark.parametrize("mode", ["short", "garbage", "deep", "error"])
def test_bad_llm_output_is_a_clear_502(server: LiveServer, llm: LiveServer, mode: str) -> None:
    llm.app.state.mode = mode
    response = translate(server, "three_sentences.wav", response_format="srt")
    assert response.status_code == 502
    error: dict[str, Any] = check_error(response.json())
    assert error["type"] == "server_error" and error["message"]
    if mode != "error":
        assert len(llm.app.state.calls) == 2  # one retry, then give up


def test_unreachable_llm_is_502() -> None:
    s = Settings(  # type: ignore[call-arg]
        _env_file=None,
        model_id="whisper-tiny.en",
        translate_base_url=f"http://127.0.0.1:{free_port()}/v1",
        translate_model="m",
        translate_timeout=5,
    )
    with live_server(create_app(s)) as srv:
        assert translate(srv, "sentence_01.wav").status_code == 502


def test_not_configured_is_501_and_transcription_still_works() -> None:
    s = Settings(_env_file=None, model_id="whisper-tiny.en")  # type: ignore[call-arg]
    with live_server(create_app(s)) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as info:
            client.audio.translations.create(
                model="whisper-1", file=("a.wav", speech.path("sentence_01.wav").read_bytes())
            )
        assert info.value.status_code == 501
        assert "TRANSLATE_BASE_URL" in info.value.message
        assert not srv.ctx.manager.loaded  # refused before decoding or loading
        assert transcript(srv, "sentence_02.wav").startswith("Please call me back")


def test_bad_target_language_is_400(server: LiveServer) -> None:
    response = translate(server, "sentence_01.wav", language="klingon")
    assert response.status_code == 400
    assert check_error(response.json())["param"] == "language"


def test_the_translation_model_gets_the_seed_temperatures(
    server: LiveServer, llm: LiveServer
) -> None:
    """TRANSLATE_TEMPERATURE (0.3) for text, TRANSLATE_SRT_TEMPERATURE (0.1) for subtitles."""
    assert translate(server, "sentence_02.wav", response_format="text").status_code == 200
    assert llm.app.state.calls[-1]["temperature"] == 0.3
    assert translate(server, "sentence_02.wav", response_format="srt").status_code == 200
    assert llm.app.state.calls[-1]["temperature"] == 0.1
