"""The HTTP routes: health, models, every transcription format, both SSE streams, subtitles,
translations, errors and metrics."""

from __future__ import annotations

import itertools
import json
import math
import re
import time
from typing import Any

import httpx
import openai
import pytest
from e2e_support import (
    API_KEY,
    WER_BOUND,
    Clip,
    normalize,
    parse_srt,
    parse_vtt,
    sse_data,
    wer,
)
from openai.types.audio import Transcription, TranscriptionVerbose

pytestmark = pytest.mark.http

TRANSCRIBE = "/v1/audio/transcriptions"


def transcribe(http: httpx.Client, clip: Clip, path: str = TRANSCRIBE, **form: Any) -> Any:
    return http.post(path, files={"file": (clip.name, clip.data)}, data=form)


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    """OpenAI's error body: {"error": {"message", "type", "param", "code"}}."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert {"message", "type", "param", "code"} <= set(error), error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    if code is not None:
        assert error["code"] == code, error
    assert response.headers.get("x-request-id"), "every response carries X-Request-ID"
    return dict(error)


# --- health and models -----------------------------------------------------------------


@pytest.mark.smoke
def test_health(anon: httpx.Client) -> None:
    response = anon.get("/health")  # never needs the API key
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert isinstance(body["model_loaded"], bool)
    assert body["model_id"] and body["engine"]
    assert isinstance(body["queue_depth"], int) and body["queue_depth"] >= 0
    assert response.headers.get("x-request-id")


@pytest.mark.smoke
def test_models(oai: openai.OpenAI, http: httpx.Client, health: dict[str, Any]) -> None:
    models = list(oai.models.list())
    ids = [m.id for m in models]
    assert health["model_id"] in ids, ids
    assert "whisper-1" in ids, "the alias stock OpenAI clients ask for"
    assert all(m.object == "model" and m.owned_by for m in models)
    raw = http.get("/v1/models").json()
    assert raw["object"] == "list" and len(raw["data"]) == len(ids)
    one = oai.models.retrieve("whisper-1")
    assert one.id == "whisper-1"


def test_unknown_model_is_a_404(http: httpx.Client) -> None:
    assert_error(http.get("/v1/models/no-such-model"), 404)


# --- POST /v1/audio/transcriptions -----------------------------------------------------


@pytest.mark.smoke
def test_transcription_json(http: httpx.Client, clip: Clip) -> None:
    response = transcribe(http, clip, model="whisper-1")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    Transcription.model_validate(body)  # the SDK's own type
    assert wer([clip.transcript], [body["text"]]) < WER_BOUND, (clip.transcript, body["text"])
    if not math.isnan(clip.duration):
        assert body["duration"] == pytest.approx(clip.duration, abs=0.1)
    assert body["usage"]["type"] == "duration"
    assert body["usage"]["seconds"] >= 1
    assert response.headers.get("x-request-id")


def test_transcription_with_the_openai_sdk(oai: openai.OpenAI, clip: Clip) -> None:
    with clip.path.open("rb") as f:
        result = oai.audio.transcriptions.create(model="whisper-1", file=f, language="en")
    assert wer([clip.transcript], [result.text]) < WER_BOUND


def test_request_id_is_echoed(http: httpx.Client) -> None:
    response = http.get("/v1/models", headers={"X-Request-ID": "e2e-request-42"})
    assert response.headers.get("x-request-id") == "e2e-request-42"


def test_transcription_text(http: httpx.Client, oai: openai.OpenAI, clip: Clip) -> None:
    response = transcribe(http, clip, response_format="text")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    assert not response.text.lstrip().startswith("{"), "text is the plain body, not JSON"
    assert wer([clip.transcript], [response.text]) < WER_BOUND
    with clip.path.open("rb") as f:  # the SDK hands the body back as a str
        text = oai.audio.transcriptions.create(model="whisper-1", file=f, response_format="text")
    assert isinstance(text, str)
    assert normalize(text) == normalize(response.text)


def test_transcription_srt(http: httpx.Client, clip: Clip) -> None:
    response = transcribe(http, clip, response_format="srt")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    cues = parse_srt(response.text)
    assert cues
    assert all(c.start < c.end for c in cues)
    assert [c.start for c in cues] == sorted(c.start for c in cues)
    assert cues[-1].end <= clip.duration + 0.5 or math.isnan(clip.duration)
    assert wer([clip.transcript], [" ".join(c.text for c in cues)]) < WER_BOUND


def test_transcription_vtt(http: httpx.Client, clip: Clip) -> None:
    response = transcribe(http, clip, response_format="vtt")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/vtt")
    cues = parse_vtt(response.text)
    assert cues and all(c.start < c.end for c in cues)
    assert wer([clip.transcript], [" ".join(c.text for c in cues)]) < WER_BOUND


def test_transcription_verbose_json_with_words(oai: openai.OpenAI, clip: Clip) -> None:
    with clip.path.open("rb") as f:
        result = oai.audio.transcriptions.create(
            model="whisper-1",
            file=f,
            response_format="verbose_json",
            timestamp_granularities=["word", "segment"],
        )
    body = result.model_dump()
    TranscriptionVerbose.model_validate(body)
    assert body["task"] == "transcribe"
    assert body["language"] and body["language"] == body["language"].lower()
    assert wer([clip.transcript], [body["text"]]) < WER_BOUND
    end = body["duration"] + 0.5
    segments = body["segments"]
    assert segments
    assert [s["id"] for s in segments] == list(range(len(segments)))
    assert all(0 <= s["start"] <= s["end"] <= end for s in segments), segments
    words = body["words"]
    assert words, "timestamp_granularities[]=word adds words"
    assert all(0 <= w["start"] <= w["end"] <= end for w in words), words
    starts = [w["start"] for w in words]
    assert starts == sorted(starts)
    assert wer([clip.transcript], [" ".join(w["word"] for w in words)]) < WER_BOUND


def test_seed_return_timestamps_adds_words(http: httpx.Client, clip: Clip) -> None:
    response = transcribe(http, clip, return_timestamps="true")
    assert response.status_code == 200, response.text
    words = response.json()["words"]
    assert words and all(w["start"] <= w["end"] for w in words)


def test_openai_sse_stream(oai: openai.OpenAI, clip: Clip) -> None:
    deltas, done = [], []
    with clip.path.open("rb") as f:
        stream = oai.audio.transcriptions.create(model="whisper-1", file=f, stream=True)
        for event in stream:
            if event.type == "transcript.text.delta":
                assert not done, "a delta after the done event"
                deltas.append(event.delta)
            elif event.type == "transcript.text.done":
                done.append(event.text)
    assert deltas, "no transcript.text.delta event"
    assert len(done) == 1
    assert "".join(deltas) == done[0], "the deltas concatenate to the done text"
    assert wer([clip.transcript], done) < WER_BOUND


def test_openai_sse_wire_format(http: httpx.Client, clip: Clip) -> None:
    files = {"file": (clip.name, clip.data)}
    with http.stream("POST", TRANSCRIBE, files=files, data={"stream": "true"}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = list(sse_data(response.iter_lines()))
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    assert parsed[-1]["type"] == "transcript.text.done"
    assert {e["type"] for e in parsed[:-1]} == {"transcript.text.delta"}


def read_seed_stream(http: httpx.Client, clip: Clip, **form: Any) -> list[Any]:
    files = {"file": (clip.name, clip.data)}
    url = TRANSCRIBE + "/stream"
    with http.stream("POST", url, files=files, data=form) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        events = list(sse_data(response.iter_lines()))
    assert events and events[-1] == "[DONE]", events[-3:]
    return [json.loads(e) for e in events[:-1]]


def check_seed_events(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict]:
    *chunks, done = events
    assert done["done"] is True and done["is_final"] is True, done
    assert chunks, "no chunk event before the done event"
    for i, chunk in enumerate(chunks):
        assert {"text", "language", "is_final", "chunk_index"} <= set(chunk), chunk
        assert chunk["chunk_index"] == i
        assert isinstance(chunk["text"], str)
        assert chunk["is_final"] is (i == len(chunks) - 1), "is_final on the last chunk only"
        assert "error" not in chunk
    merged = " ".join(c["text"] for c in chunks if c["text"].strip())
    assert normalize(done["text"]) == normalize(merged)
    return chunks, done


def test_seed_sse_stream(http: httpx.Client, clip: Clip) -> None:
    _, done = check_seed_events(read_seed_stream(http, clip))
    assert wer([clip.transcript], [done["text"]]) < WER_BOUND
    assert done["language"] is None or done["language"][:1].isupper(), "the seed's form"


def test_seed_sse_stream_with_timestamps(http: httpx.Client, clip: Clip) -> None:
    chunks, _ = check_seed_events(read_seed_stream(http, clip, return_timestamps="true"))
    words = [w for c in chunks for w in c.get("words", [])]
    assert words and all(w["start"] <= w["end"] for w in words)


@pytest.mark.slow
def test_seed_sse_stream_long_audio_comes_in_chunks(http: httpx.Client, long_clip: Clip) -> None:
    started = time.monotonic()
    chunks, done = check_seed_events(read_seed_stream(http, long_clip, language="en"))
    took = time.monotonic() - started
    assert len(chunks) >= 2, "a long file is cut into several segments"
    for before, after in itertools.pairwise(chunks):
        assert before["end"] <= after["start"] + 0.01, "chunks in order, no overlap"
    assert done["duration"] == pytest.approx(long_clip.duration, abs=0.1)
    error = wer([long_clip.transcript], [done["text"]])
    assert error < WER_BOUND, (error, done["text"])
    print(f"{long_clip.name}: {len(chunks)} chunks in {took:.1f} s, WER {error:.3f}")


@pytest.mark.slow
def test_accuracy_over_all_clips(http: httpx.Client, speech: list[Clip]) -> None:
    hyps = []
    for clip in speech:
        response = transcribe(http, clip, language="en")
        assert response.status_code == 200, response.text
        hyps.append(response.json()["text"])
    error = wer([c.transcript for c in speech], hyps)
    print(f"corpus WER over {len(speech)} clips: {error:.3f}")
    assert error < WER_BOUND


# --- subtitles and translations --------------------------------------------------------


def test_subtitles_srt(http: httpx.Client, multi_clip: Clip) -> None:
    response = transcribe(http, multi_clip, path="/v1/audio/subtitles")
    assert response.status_code == 200, response.text
    disposition = response.headers.get("content-disposition", "")
    assert "attachment" in disposition and 'filename="subtitles.srt"' in disposition
    cues = parse_srt(response.text)
    assert cues
    for cue in cues:
        assert cue.start < cue.end <= cue.start + 7.001, cue
        assert 1 <= len(cue.lines) <= 2 and all(len(line) <= 42 for line in cue.lines), cue
    for before, after in itertools.pairwise(cues):
        assert before.end <= after.start, "subtitle cues never overlap"
    assert wer([multi_clip.transcript], [" ".join(c.text for c in cues)]) < WER_BOUND


def test_subtitles_vtt(http: httpx.Client, clip: Clip) -> None:
    response = transcribe(http, clip, path="/v1/audio/subtitles", response_format="vtt")
    assert response.status_code == 200, response.text
    assert 'filename="subtitles.vtt"' in response.headers.get("content-disposition", "")
    assert parse_vtt(response.text)


def test_subtitles_without_a_file_is_422(http: httpx.Client) -> None:
    assert_error(http.post("/v1/audio/subtitles", data={"mode": "fast"}), 422)


def translation_or_skip(response: httpx.Response) -> httpx.Response:
    if response.status_code == 501:
        error = assert_error(response, 501)
        assert error["code"] == "not_configured", error
        pytest.skip(
            "translation is not configured on this deployment (501 not_configured: set "
            "TRANSLATE_BASE_URL, TRANSLATE_MODEL, TRANSLATE_API_KEY)"
        )
    assert response.status_code == 200, response.text
    return response


def test_translation_json(http: httpx.Client, oai: openai.OpenAI, clip: Clip) -> None:
    response = translation_or_skip(transcribe(http, clip, path="/v1/audio/translations"))
    body = response.json()
    assert body["text"].strip()
    assert body["language"] and body["source_language"]
    # English speech translated into English: the same words, give or take the LLM's wording.
    assert wer([clip.transcript], [body["text"]]) < WER_BOUND, body
    with clip.path.open("rb") as f:
        result = oai.audio.translations.create(model="whisper-1", file=f)
    assert result.text.strip()


def test_translation_srt_keeps_the_cues(http: httpx.Client, multi_clip: Clip) -> None:
    path = "/v1/audio/translations"
    response = translation_or_skip(transcribe(http, multi_clip, path=path, response_format="srt"))
    disposition = response.headers.get("content-disposition", "")
    assert 'filename="translated_subtitles.srt"' in disposition
    original = parse_srt(transcribe(http, multi_clip, path="/v1/audio/subtitles").text)
    translated = parse_srt(response.text)
    assert [(c.start, c.end) for c in translated] == [(c.start, c.end) for c in original]
    assert all(c.text.strip() for c in translated)


# --- errors --------------------------------------------------------------------------------


def test_garbage_audio_is_400_invalid_audio(http: httpx.Client, oai: openai.OpenAI) -> None:
    garbage = bytes(range(256)) * 16
    error = assert_error(
        http.post(TRANSCRIBE, files={"file": ("noise.wav", garbage)}), 400, "invalid_audio"
    )
    assert error["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as raised:  # the SDK raises the right exception
        oai.audio.transcriptions.create(model="whisper-1", file=("noise.wav", garbage))
    assert raised.value.code == "invalid_audio"


def test_bad_fields_are_400_naming_the_field(http: httpx.Client, clip: Clip) -> None:
    error = assert_error(transcribe(http, clip, response_format="xml"), 400)
    assert error["param"] == "response_format"
    error = assert_error(transcribe(http, clip, language="klingon"), 400)
    assert (error["param"], error["code"]) == ("language", "unsupported_language")
    error = assert_error(http.post(TRANSCRIBE, files={"file": ("empty.wav", b"")}), 400)
    assert error["param"] == "file"
    error = assert_error(http.post(TRANSCRIBE, data={"model": "whisper-1"}), 400)
    assert error["param"] == "file"


def test_unknown_route_and_method(http: httpx.Client) -> None:
    assert_error(http.get("/v1/no-such-route"), 404)
    assert_error(http.get(TRANSCRIBE), 405)


# --- auth ----------------------------------------------------------------------------------

needs_key = pytest.mark.skipif(
    not API_KEY, reason="E2E_API_KEY is not set (set it when the deployment has API_KEY)"
)


@needs_key
@pytest.mark.smoke
def test_auth_required_without_a_key(anon: httpx.Client, clip: Clip) -> None:
    assert_error(anon.get("/v1/models"), 401, "invalid_api_key")
    assert_error(transcribe(anon, clip), 401)
    wrong = {"Authorization": "Bearer wrong-key"}
    assert_error(anon.get("/v1/models", headers=wrong), 401)
    assert anon.get("/health").status_code == 200, "/health never needs the key"


@needs_key
def test_auth_with_the_sdk(clip: Clip, oai: openai.OpenAI) -> None:
    bad = openai.OpenAI(base_url=str(oai.base_url), api_key="wrong-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


# --- metrics -------------------------------------------------------------------------------

SAMPLE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*(\{.*\})? [^ ]+( [0-9]+)?$")


def test_metrics(http: httpx.Client, anon: httpx.Client) -> None:
    response = http.get("/metrics")
    if response.status_code == 404:
        pytest.skip("this deployment has no /metrics (404)")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    lines = response.text.splitlines()
    assert any(line.startswith("# TYPE ") for line in lines), "Prometheus text has # TYPE"
    samples = [line for line in lines if line and not line.startswith("#")]
    assert samples
    bad = [line for line in samples if not SAMPLE.match(line)]
    assert not bad, f"not Prometheus samples: {bad[:3]}"
    if API_KEY:
        assert_error(anon.get("/metrics"), 401)
