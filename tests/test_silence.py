"""Silence is not words (issue 41): a segment in which voice detection hears no speech never
reaches the model, so a silent or near-silent upload answers empty text, on whisper and on
Qwen. Before, whisper-tiny.en heard "You" in 5 s of silence and Qwen its random tokens."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile as sf

import speech
from helpers import whisper_settings
from qwen3_asr_server.app import create_app
from qwen3_asr_server.audio.vad import SileroModel, has_speech, may_be_silent, may_hold_speech
from server import LiveServer, live_server

RNG = np.random.default_rng(7)
SILENT = {
    "digital silence": np.zeros(5 * 16000, np.float32),
    "room noise at -50 dB": (RNG.standard_normal(5 * 16000) * 0.003).astype(np.float32),
}


def wav(samples: np.ndarray) -> bytes:
    out = io.BytesIO()
    sf.write(out, samples, 16000, format="WAV", subtype="PCM_16")
    return out.getvalue()


def post(srv: LiveServer, samples: np.ndarray) -> dict[str, Any]:
    response = httpx.post(
        srv.url + "/v1/audio/transcriptions",
        files={"file": ("a.wav", wav(samples))},
        data={"response_format": "verbose_json"},
        timeout=300,
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def sentence() -> np.ndarray:
    return sf.read(speech.path("sentence_02.wav"), dtype="float32")[0]


def test_loud_audio_goes_to_the_model_without_voice_detection() -> None:
    """Only quiet segments are asked of the VAD: ordinary speech never loads it (~45 MB in the
    server process), and a loud segment is taken as it is."""
    assert not may_be_silent(sentence())
    assert not may_be_silent((0.3 * np.sin(np.arange(16000) / 5)).astype(np.float32))
    for samples in SILENT.values():
        assert may_be_silent(samples)
    assert may_be_silent(sentence() * 0.01)  # speech at -40 dB: the VAD decides


def test_voice_detection_tells_speech_from_silence() -> None:
    vad = SileroModel()
    for samples in SILENT.values():
        assert not has_speech(vad, samples)
    assert has_speech(vad, sentence())
    # speech at the very end of a long silence is found (the whole stretch is read)
    assert has_speech(vad, np.concatenate([np.zeros(40 * 16000, np.float32), sentence()]))
    assert not has_speech(vad, np.zeros(0, np.float32))
    assert may_hold_speech(vad, sentence() * 0.01)  # quiet speech is still heard
    assert not may_hold_speech(vad, SILENT["room noise at -50 dB"])


@pytest.fixture(scope="module")
def whisper_server() -> Iterator[LiveServer]:
    with live_server(create_app(whisper_settings())) as srv:
        yield srv


@pytest.mark.parametrize("name", list(SILENT))
def test_a_silent_upload_answers_empty_text_on_whisper(
    whisper_server: LiveServer, name: str
) -> None:
    body = post(whisper_server, SILENT[name])
    assert body["text"] == "" and body["segments"] == [], body
    assert body["duration"] == pytest.approx(5.0, abs=0.01)
    # speech after the same silence is still heard
    body = post(whisper_server, np.concatenate([SILENT[name], sentence()]))
    assert "please call me" in body["text"].lower(), body


def test_a_silent_upload_answers_empty_text_on_qwen(
    qwen_settings: Callable[..., Any],
) -> None:
    with live_server(create_app(qwen_settings())) as srv:
        assert post(srv, SILENT["digital silence"])["text"] == ""
        assert post(srv, sentence())["text"]  # random weights: tokens, but some
