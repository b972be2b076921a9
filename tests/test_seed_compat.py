"""What clients of the seed server (the one this project replaces) test for: the json
language name, the seed's SSE fields, subtitle downloads and the seed's 422 on a missing
file. Whisper with real speech, real uvicorn, plain HTTP as those clients use it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import srt

import speech
from contract import check_error, check_transcription, sse_data
from helpers import whisper_settings
from qwen3_asr_server.app import create_app
from server import LiveServer, live_server
from wer import normalize

pytestmark = pytest.mark.slow

CLIP = "three_sentences.wav"  # ~10 s, three sentences with 1 s pauses


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    # 5 s segments: the clip streams as several chunks.
    with live_server(create_app(whisper_settings(segment_max_seconds=5))) as srv:
        yield srv


def post(srv: LiveServer, path: str, name: str = CLIP, **data: str) -> httpx.Response:
    return httpx.post(
        srv.url + path,
        files={"file": (name, speech.path(name).read_bytes())},
        data=data,
        timeout=120,
    )


def seed_stream(srv: LiveServer, **data: str) -> list[dict[str, Any]]:
    response = post(srv, "/v1/audio/transcriptions/stream", **data)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    payloads = sse_data(response.text)
    assert payloads[-1] == "[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


def test_json_language_is_the_seed_s_name_and_verbose_json_openai_s(server: LiveServer) -> None:
    body = post(server, "/v1/audio/transcriptions", "sentence_02.wav").json()
    assert check_transcription(body).language == "English"  # type: ignore[attr-defined]
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    raw = client.audio.transcriptions.with_raw_response.create(
        model="whisper-1",
        file=("a.wav", speech.path("sentence_02.wav").read_bytes()),
        response_format="verbose_json",
    )
    assert check_transcription(raw.http_response.json(), "verbose_json").language == "english"


def test_seed_stream_chunk_events_and_done(server: LiveServer) -> None:
    events = seed_stream(server)
    chunks, done = events[:-1], events[-1]
    assert len(chunks) >= 2
    for i, chunk in enumerate(chunks):
        assert {"text", "language", "is_final", "chunk_index"} <= set(chunk)
        assert chunk["chunk_index"] == chunk["index"] == i
        assert chunk["type"] == "segment" and chunk["end"] > chunk["start"]
        assert chunk["language"] == "English"
        assert chunk["is_final"] is (i == len(chunks) - 1)  # the seed: true on the last chunk
        assert "words" not in chunk
    assert done["done"] is True and done["is_final"] is True
    assert done["type"] == "done" and done["segments"] == len(chunks)
    assert done["language"] == "English"
    assert normalize(done["text"]) == normalize(" ".join(c["text"] for c in chunks))
    assert normalize(done["text"]).startswith("the quick")


def test_seed_stream_return_timestamps_adds_words_per_chunk(server: LiveServer) -> None:
    events = seed_stream(server, return_timestamps="true", language="en")
    chunks = events[:-1]
    assert events[-1]["done"] is True
    for chunk in chunks:
        words = chunk["words"]
        assert [w["word"] for w in words] and set(words[0]) == {"word", "start", "end"}
        # times are in the whole file, inside this chunk
        assert all(
            chunk["start"] - 1e-3 <= w["start"] <= w["end"] <= chunk["end"] + 1e-3 for w in words
        )
    first = [w["word"].strip(".,").lower() for w in chunks[0]["words"]]
    assert first[:2] == ["the", "quick"]


@pytest.mark.parametrize(
    ("response_format", "name"), [("srt", "subtitles.srt"), ("vtt", "subtitles.vtt")]
)
def test_subtitles_are_a_download(server: LiveServer, response_format: str, name: str) -> None:
    response = post(server, "/v1/audio/subtitles", response_format=response_format)
    assert response.status_code == 200
    assert response.headers["content-disposition"] == f'attachment; filename="{name}"'
    if response_format == "srt":
        assert len(list(srt.parse(response.text))) >= 3


def test_subtitles_without_a_file_is_422_in_openai_shape(server: LiveServer) -> None:
    response = httpx.post(server.url + "/v1/audio/subtitles", data={"mode": "fast"}, timeout=30)
    assert response.status_code == 422
    error = check_error(response.json())
    assert error["param"] == "file" and error["type"] == "invalid_request_error"
    assert response.headers["x-request-id"]
    # other validation errors there, and a missing file elsewhere, stay OpenAI's 400
    bad = post(server, "/v1/audio/subtitles", max_line_chars="3")
    assert bad.status_code == 400 and check_error(bad.json())["param"] == "max_line_chars"
    for path in ("/v1/audio/transcriptions", "/v1/audio/transcriptions/stream"):
        missing = httpx.post(server.url + path, data={"model": "x"}, timeout=30)
        assert missing.status_code == 400 and check_error(missing.json())["param"] == "file"
