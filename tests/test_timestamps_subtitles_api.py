"""Word timestamps (forced aligner / native / spread) and /v1/audio/subtitles through the
API: Qwen with the tiny checkpoint and tiny aligner, whisper with real speech."""

from __future__ import annotations

import io
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
import srt
import webvtt

import speech
from contract import check_transcription
from qwen3_asr_server.app import create_app
from qwen3_asr_server.config import Settings
from server import LiveServer, live_server
from wer import normalize, wer

pytestmark = pytest.mark.slow


def settings(**values: Any) -> Settings:
    return Settings(_env_file=None, idle_timeout=0, **values)  # type: ignore[call-arg]


@pytest.fixture(scope="module")
def qwen_aligned(tiny_qwen_dir: Path, tiny_aligner_dir: Path) -> Iterator[LiveServer]:
    s = settings(
        model_id=str(tiny_qwen_dir), max_new_tokens=8, forced_aligner_id=str(tiny_aligner_dir)
    )
    with live_server(create_app(s)) as srv:
        yield srv


@pytest.fixture(scope="module")
def whisper() -> Iterator[LiveServer]:
    with live_server(create_app(settings(model_id="whisper-tiny.en"))) as srv:
        yield srv


def words_of(srv: LiveServer, name: str, **data: str) -> dict[str, Any]:
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
    raw = client.audio.transcriptions.with_raw_response.create(
        model="whisper-1",
        file=(name, speech.path(name).read_bytes()),
        response_format="verbose_json",
        timestamp_granularities=["word"],
        **data,  # type: ignore[arg-type]
    )
    body: dict[str, Any] = raw.http_response.json()
    assert check_transcription(body, "verbose_json").words
    return body


def assert_monotonic_within(words: list[dict[str, Any]], duration: float) -> None:
    assert words
    assert all(0 <= w["start"] <= w["end"] <= duration + 1e-3 for w in words)
    assert all(a["start"] <= b["start"] for a, b in itertools.pairwise(words))


@pytest.mark.parametrize("language", ["en", "zh", "th"])  # th: not an aligner language
def test_qwen_word_timestamps_monotonic_and_inside_the_audio(
    qwen_aligned: LiveServer, language: str
) -> None:
    body = words_of(qwen_aligned, "three_sentences.wav", language=language)
    assert_monotonic_within(body["words"], body["duration"])
    if language == "th":  # no aligner for Thai: the segment's time is spread over its words
        assert body["words"][0]["start"] == 0
        assert body["words"][-1]["end"] == pytest.approx(body["duration"], abs=1e-3)


def test_aligner_loads_lazily_and_unloads_with_the_model(qwen_aligned: LiveServer) -> None:
    engine = qwen_aligned.engine
    words_of(qwen_aligned, "sentence_01.wav", language="en")
    assert engine._aligner is not None
    import asyncio

    manager = qwen_aligned.ctx.manager
    manager.idle_timeout = 0.001
    future = asyncio.run_coroutine_threadsafe(manager.unload_if_idle(), qwen_aligned.server_loop)
    assert future.result(30)
    assert engine._aligner is None and not manager.loaded
    manager.idle_timeout = 0


def test_seed_return_timestamps_on_qwen(qwen_aligned: LiveServer) -> None:
    response = httpx.post(
        qwen_aligned.url + "/v1/audio/transcriptions",
        files={"file": ("a.wav", speech.path("sentence_03.wav").read_bytes())},
        data={"return_timestamps": "true", "language": "en"},
        timeout=120,
    )
    assert check_transcription(response.json()).language == "English"  # type: ignore[attr-defined]
    assert_monotonic_within(response.json()["words"], response.json()["duration"])


def test_whisper_native_word_timestamps(whisper: LiveServer) -> None:
    body = words_of(whisper, "three_sentences.wav")
    assert_monotonic_within(body["words"], body["duration"])
    # The second sentence starts after the first 1 s pause: native timing sees it.
    please = next(w for w in body["words"] if w["word"].lower().startswith("please"))
    first_end = max(w["end"] for w in body["words"] if w["start"] < please["start"])
    assert please["start"] - first_end > 0.5


def subtitles(srv: LiveServer, name: str, **data: str) -> httpx.Response:
    return httpx.post(
        srv.url + "/v1/audio/subtitles",
        files={"file": (name, speech.path(name).read_bytes())},
        data=data,
        timeout=120,
    )


@pytest.mark.parametrize("mode", ["fast", "accurate"])
def test_whisper_subtitles(whisper: LiveServer, mode: str) -> None:
    response = subtitles(whisper, "long_2min.wav", mode=mode, max_line_chars="32")
    assert response.status_code == 200
    assert response.headers["content-disposition"] == 'attachment; filename="subtitles.srt"'
    cues = list(srt.parse(response.text))
    assert len(cues) >= 20
    for cue in cues:
        lines = cue.content.split("\n")
        assert len(lines) <= 2 and all(len(line) <= 32 for line in lines)
        assert cue.end > cue.start
    assert all(a.end <= b.start for a, b in itertools.pairwise(cues))
    text = " ".join(c.content.replace("\n", " ") for c in cues)
    assert wer([speech.transcripts()["long_2min.wav"]], [text]) < 0.22
    assert [c.index for c in cues] == list(range(1, len(cues) + 1))


def test_subtitle_cues_end_within_the_audio(whisper: LiveServer) -> None:
    """issue 41: a short last cue ran past the end of the audio (SUBTITLE_MIN_DURATION)."""
    clip, _ = sf.read(speech.path("sentence_02.wav"), dtype="float32")
    start = np.flatnonzero(np.abs(clip) > 0.01)[0]
    short = clip[start : start + 9600]  # 0.6 s: "Please", a cue shorter than the minimum
    out = io.BytesIO()
    sf.write(out, short, 16000, format="WAV")
    duration = len(short) / 16000
    for data in ({}, {"mode": "accurate"}):
        response = httpx.post(
            whisper.url + "/v1/audio/subtitles",
            files={"file": ("short.wav", out.getvalue())},
            data=data,
            timeout=120,
        )
        cues = list(srt.parse(response.text))
        assert cues and all(c.end.total_seconds() <= duration + 0.001 for c in cues), (
            duration,
            response.text,
        )


def test_subtitles_vtt(whisper: LiveServer) -> None:
    response = subtitles(whisper, "three_sentences.wav", response_format="vtt")
    assert response.headers["content-type"].startswith("text/vtt")
    assert response.headers["content-disposition"] == 'attachment; filename="subtitles.vtt"'
    captions = webvtt.from_buffer(io.StringIO(response.text))
    assert normalize(" ".join(c.text for c in captions)).startswith("the quick")


def test_accurate_without_an_aligner_is_a_clear_error(tiny_qwen_dir: Path) -> None:
    with live_server(create_app(settings(model_id=str(tiny_qwen_dir), max_new_tokens=8))) as srv:
        response = subtitles(srv, "sentence_01.wav", mode="accurate")
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["param"] == "mode" and "FORCED_ALIGNER_ID" in error["message"]
        assert not srv.ctx.manager.loaded  # refused before any work
        fast = subtitles(srv, "sentence_01.wav", mode="fast", language="en")
        assert fast.status_code == 200
        assert list(srt.parse(fast.text)), fast.text  # cues, not an empty file


def test_qwen_accurate_subtitles_with_the_aligner(qwen_aligned: LiveServer) -> None:
    """Cues from the aligner's word times, in order and apart. Two minutes of speech: cut
    into segments, each with its own (noise) text, so there are cues to order (the tiny
    checkpoint writes one word per segment)."""
    response = subtitles(qwen_aligned, "long_2min.wav", mode="accurate", language="zh")
    assert response.status_code == 200
    cues = list(srt.parse(response.text))
    assert len(cues) >= 3, response.text
    assert all(a.end <= b.start for a, b in itertools.pairwise(cues))


def test_subtitle_parameters_are_validated(whisper: LiveServer) -> None:
    bad = subtitles(whisper, "sentence_01.wav", max_line_chars="3")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_line_chars"
    bad = subtitles(whisper, "sentence_01.wav", mode="slow")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "mode"
