"""The 2026 OpenAI upload fields (issue 31), with the openai SDK as the client and every body
validated by the SDK's own types: keywords, candidate languages, detected languages,
include[]=logprobs, token usage, chunking_strategy. Whisper with real speech; Qwen through the
real SDK on the tiny checkpoint (its text is noise, so Qwen's tests check the plumbing: what
reaches the model's prompt, the header it may write, the token counts)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from openai.types.audio import TranscriptionTextDoneEvent
from qwen_asr import Qwen3ASRModel

import speech
from audio_files import encode
from contract import check_error, check_stream, check_transcription
from engines import Recording
from helpers import whisper_settings
from qwen3_asr_server.app import create_app
from qwen3_asr_server.config import Settings
from qwen3_asr_server.engines import create_engine
from server import LiveServer, live_server

pytestmark = pytest.mark.slow

CLIP = "sentence_01.wav"  # "The quick brown fox jumped over the lazy dog."


@pytest.fixture(scope="module")
def whisper() -> Iterator[LiveServer]:
    with live_server(create_app(whisper_settings())) as srv:
        yield srv


@pytest.fixture(scope="module")
def qwen(tiny_qwen_dir: Path) -> Iterator[LiveServer]:
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None, model_id=str(tiny_qwen_dir), max_new_tokens=40, idle_timeout=0
    )
    with live_server(create_app(settings)) as srv:
        yield srv


def client(srv: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)


def transcribe(srv: LiveServer, clip: str = CLIP, **fields: Any) -> Any:
    fields.setdefault("model", "gpt-transcribe")
    return client(srv).audio.transcriptions.create(file=speech.path(clip), **fields)


def joined(logprobs: list[Any]) -> str:
    # the SDK types json bytes as floats, stream bytes as ints
    return bytes(int(b) for item in logprobs for b in item.bytes).decode("utf-8", "replace")


# -- whisper, real speech ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "model",
    [
        "whisper-1",
        "gpt-transcribe",
        "gpt-4o-transcribe",
        "gpt-4o-mini-transcribe",
        "gpt-4o-mini-transcribe-2025-12-15",
        "whisper-tiny.en",
        "any-name",
    ],
)
def test_every_model_name_means_the_served_model(whisper: LiveServer, model: str) -> None:
    result = transcribe(whisper, model=model)
    assert "fox" in result.text.lower()


def test_json_names_the_detected_languages_and_the_usage(whisper: LiveServer) -> None:
    result = transcribe(whisper)
    check_transcription(result.model_dump())
    assert [lang.code for lang in result.languages] == ["en"]
    assert result.usage.type == "duration" and result.usage.seconds >= 1  # whisper: no tokens


def test_logprobs_are_the_texts_tokens(whisper: LiveServer) -> None:
    result = transcribe(whisper, include=["logprobs"])
    assert result.logprobs, result
    assert all(item.logprob <= 0 for item in result.logprobs)
    assert joined(result.logprobs).strip() == result.text
    assert "".join(item.token for item in result.logprobs).strip() == result.text


def test_the_stream_carries_logprobs_languages_and_the_whole_text(whisper: LiveServer) -> None:
    stream = transcribe(whisper, include=["logprobs"], stream=True)
    events = list(stream)
    deltas, done = events[:-1], events[-1]
    assert done.type == "transcript.text.done"
    assert [lang.code for lang in done.languages] == ["en"]
    assert done.logprobs and joined(done.logprobs).strip() == done.text
    assert all(d.logprobs for d in deltas)


def test_the_streams_done_event_counts_whispers_tokens(whisper: LiveServer) -> None:
    """The done event's `usage` (the SDK's type: tokens only), as Qwen's has (issue 49):
    whisper's encoder positions (50 a second of audio) in, the tokens it wrote out."""
    done = list(transcribe(whisper, stream=True))[-1]
    assert done.type == "transcript.text.done" and "fox" in done.text.lower()
    TranscriptionTextDoneEvent.model_validate(done.to_dict())  # strictly the SDK's type
    usage = done.usage
    assert usage is not None and usage.type == "tokens", done
    seconds = sf.info(speech.path(CLIP)).duration
    assert usage.input_token_details.audio_tokens == math.ceil(seconds * 50)
    assert usage.input_tokens == usage.input_token_details.audio_tokens
    assert usage.output_tokens >= len(done.text.split())  # at least a token a word
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


def test_keywords_reach_whispers_decoder(whisper: LiveServer) -> None:
    """tiny.en hears "brown fox" as "round fox"; the keyword "Fox Jumps" changes the text."""
    plain = transcribe(whisper).text
    biased = transcribe(whisper, keywords=["Fox Jumps"]).text
    assert "Fox Jumps" not in plain and "Fox Jumps" in biased


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"include": ["logprobs"], "response_format": "verbose_json"}, "include"),
        ({"include": ["logprobs"], "response_format": "text"}, "include"),
        ({"include": ["nonsense"]}, "include"),
        ({"keywords": [f"k{i}" for i in range(101)]}, "keywords"),
        ({"keywords": ["x" * 101]}, "keywords"),
        ({"languages": ["de"]}, "languages"),  # tiny.en is English only
        ({"languages": ["xx-not-a-language"]}, "languages"),
        ({"chunking_strategy": {"type": "server_vad", "threshold": 2}}, "chunking_strategy"),
        ({"chunking_strategy": {"type": "semantic"}}, "chunking_strategy"),
        ({"extra_body": {"chunking_strategy": "sometimes"}}, "chunking_strategy"),
        ({"extra_body": {"chunking_strategy": '"sometimes"'}}, "chunking_strategy"),
        # nested past the parser's recursion limit: was a 500 (issue 58 §7.3)
        ({"extra_body": {"chunking_strategy": "[" * 100_000}}, "chunking_strategy"),
    ],
)
def test_bad_fields_get_a_clear_400(
    whisper: LiveServer, fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        transcribe(whisper, **fields)
    body = check_error(caught.value.response.json())
    assert body["param"] == param, body


def test_chunking_strategy_is_accepted_in_every_form(whisper: LiveServer) -> None:
    assert "fox" in transcribe(whisper, chunking_strategy="auto").text.lower()
    vad = {"type": "server_vad", "threshold": 0.4, "silence_duration_ms": 300}
    assert "fox" in transcribe(whisper, chunking_strategy=vad).text.lower()
    # curl's JSON-string form
    response = httpx.post(
        whisper.url + "/v1/audio/transcriptions",
        files={"file": (CLIP, speech.path(CLIP).read_bytes())},
        data={"chunking_strategy": '{"type": "server_vad", "prefix_padding_ms": 200}'},
        timeout=120,
    )
    assert response.status_code == 200 and "fox" in response.json()["text"].lower()
    # SDKs that JSON-encode every form field send "auto" quoted (issue 49)
    quoted = transcribe(whisper, extra_body={"chunking_strategy": '"auto"'})
    assert "fox" in quoted.text.lower()


# -- qwen, the real SDK on the tiny checkpoint ----------------------------------------------------
def test_qwen_counts_tokens(qwen: LiveServer) -> None:
    result = transcribe(qwen, clip="sentence_02.wav", language="en")
    body = check_transcription(result.model_dump())
    usage = body.usage
    assert usage.type == "tokens"
    assert usage.input_token_details.audio_tokens >= 13 * 2  # ~13 audio tokens a second
    assert usage.input_tokens == sum(
        [usage.input_token_details.audio_tokens, usage.input_token_details.text_tokens]
    )
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert 1 <= usage.output_tokens <= 40


def test_qwen_logprobs_join_to_the_text(qwen: LiveServer) -> None:
    result = transcribe(qwen, clip="sentence_02.wav", language="en", include=["logprobs"])
    assert result.logprobs is not None
    assert all(item.logprob <= 0 for item in result.logprobs)
    # random weights write control characters; the text's whitespace is normalised
    assert joined(result.logprobs).split() == result.text.split()


def test_qwen_keywords_reach_the_models_prompt(
    qwen: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK's `context` is the system turn of the prompt the model sees."""
    prompts: list[str] = []
    real = Qwen3ASRModel._build_text_prompt

    def spy(self: Any, *args: Any, **kwargs: Any) -> str:
        prompts.append(real(self, *args, **kwargs))
        return prompts[-1]

    monkeypatch.setattr(Qwen3ASRModel, "_build_text_prompt", spy)
    transcribe(qwen, prompt="A talk on clusters.", keywords=["Kubernetes", "Siobhan Okafor"])
    system = prompts[-1].split("<|im_end|>")[0]
    assert system.endswith("A talk on clusters.\nKubernetes, Siobhan Okafor"), prompts[-1]


def test_qwen_detection_stays_within_the_candidates(qwen: LiveServer) -> None:
    """Random weights never write a language header on their own; with candidates the
    header is constrained to one of them, so the answer names a candidate."""
    free = transcribe(qwen, clip="sentence_03.wav")
    assert free.languages == []  # nothing detected, nothing echoed
    for candidates in (["de", "fr"], ["ja"]):
        result = transcribe(qwen, clip="sentence_03.wav", languages=candidates)
        assert [lang.code for lang in result.languages] in [[c] for c in candidates]


def test_qwen_stream_done_has_token_usage(qwen: LiveServer) -> None:
    response = httpx.post(
        qwen.url + "/v1/audio/transcriptions",
        files={"file": (CLIP, speech.path(CLIP).read_bytes())},
        data={"stream": "true", "languages[]": ["de", "fr"]},
        timeout=120,
    )
    events = check_stream(response.text)
    done = events[-1]
    assert done.usage is not None and done.usage.type == "tokens"
    assert [lang.code for lang in done.languages or []] in (["de"], ["fr"])


def trimmed(name: str) -> np.ndarray:
    """A sentence without its leading and trailing quiet (so two of them meet with no pause)."""
    audio, _ = sf.read(speech.path(name), dtype="float32")
    loud = np.flatnonzero(np.abs(audio) > 0.02)
    return audio[loud[0] : loud[-1] + 1]


def test_chunking_strategy_chooses_where_a_long_file_is_cut() -> None:
    """A long file's first segment is cut at a pause between 5 and 10 s: here a 0.9 s pause
    at 6 s and a 0.35 s one at 8.5 s (the speech between them has no pause). The default
    cuts at the last pause (the short one); silence_duration_ms=700 only at one that long."""
    body = np.concatenate([trimmed(f"sentence_{i:02d}.wav") for i in range(2, 9)])
    second = 16000
    audio = np.concatenate(
        [
            body[: 6 * second],
            np.zeros(int(0.9 * second), np.float32),
            body[int(7.2 * second) : int(8.8 * second)],
            np.zeros(int(0.35 * second), np.float32),
            body[int(8.8 * second) : 20 * second],
        ]
    )
    wav = encode(audio, 16000, "WAV")
    cuts = {}
    for name, strategy in (
        ("default", None),
        ("long", {"type": "server_vad", "silence_duration_ms": 700, "threshold": 0.5}),
    ):
        settings = whisper_settings(segment_max_seconds=20, compact_pauses_ms=0)
        engine = Recording(create_engine(settings))
        with live_server(create_app(settings, engine=engine)) as srv:  # type: ignore[arg-type]
            extra = {"chunking_strategy": strategy} if strategy else {}
            client(srv).audio.transcriptions.create(
                model="whisper-1", file=("cut.wav", wav), **extra
            )
        cuts[name] = engine.calls[0]
    assert 8.5 <= cuts["default"] <= 8.85, cuts
    assert 6.0 <= cuts["long"] <= 6.9, cuts
