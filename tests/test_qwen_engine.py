"""The Qwen engine against what the real checkpoints and GPUs need: word times that keep
the transcript's words, refusing checkpoints with missing weights, the aligner loaded with
the model, short clips, duration groups, and the device/dtype/attention choices."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from qwen_asr.inference.qwen3_forced_aligner import Qwen3ForceAlignProcessor

from audio_files import encode
from qwen3_asr_server.app import create_app
from qwen3_asr_server.config import Settings
from qwen3_asr_server.engines import create_engine
from qwen3_asr_server.engines.base import TranscribeRequest, never_stop
from qwen3_asr_server.engines.qwen.engine import QwenEngine
from qwen3_asr_server.engines.qwen.generate import duration_groups
from qwen3_asr_server.engines.qwen.load import choose_attention, choose_dtype
from qwen3_asr_server.engines.qwen.rows import padded
from qwen3_asr_server.engines.qwen.word_times import words_from_items
from qwen3_asr_server.errors import ModelLoadError
from qwen3_asr_server.models.choice import DEFAULT_CPU_MODEL
from qwen3_asr_server.text import join_texts
from server import live_server

ENGLISH = "Hello, world. It costs $3.50 at 9:30; a state-of-the-art model, isn't it?"
CHINESE = "你好，世界。今天天气很好！我们去公园吧。"


class Item:
    def __init__(self, text: str, start: float, end: float) -> None:
        self.text, self.start_time, self.end_time = text, start, end


def sdk_items(text: str) -> list[Item]:
    """Items as the SDK's aligner builds them from a transcript (its own tokenizer)."""
    tokens, _ = Qwen3ForceAlignProcessor().encode_timestamp(text, "English")
    return [Item(t, 0.1 * k, 0.1 * k + 0.08) for k, t in enumerate(tokens)]


@pytest.mark.parametrize("text", [ENGLISH, CHINESE, "¿Qué tal? «Bien», gracias."])
def test_words_keep_the_transcripts_own_text(text: str) -> None:
    items = sdk_items(text)
    assert "".join(i.text for i in items) != text.replace(" ", "")  # the SDK drops symbols
    words = words_from_items(text, items, duration=10.0)
    assert words is not None
    assert join_texts([w.word for w in words]) == text
    assert [w.start for w in words] == [i.start_time for i in items]


def test_english_words_carry_punctuation_numbers_and_hyphens() -> None:
    words = words_from_items(ENGLISH, sdk_items(ENGLISH), duration=10.0)
    assert words is not None
    texts = [w.word for w in words]
    assert texts[:2] == ["Hello,", "world."]
    assert "$3.50" in texts and "9:30;" in texts and "state-of-the-art" in texts
    assert texts[-1] == "it?"


def test_items_that_do_not_spell_the_transcript_are_refused() -> None:
    assert words_from_items("hello world", [Item("hello", 0, 1), Item("there", 1, 2)], 5) is None
    assert words_from_items("hello world", [Item("hello", 0, 1)], 5) is None


def test_dtype_choice() -> None:
    assert choose_dtype("auto", cuda=False, bf16_supported=False) == "float32"
    assert choose_dtype("auto", cuda=True, bf16_supported=True) == "bfloat16"
    assert choose_dtype("auto", cuda=True, bf16_supported=False) == "float32"  # fp16 -> NaN
    assert choose_dtype("float16", cuda=True, bf16_supported=True) == "float16"


def test_attention_choice() -> None:
    ampere, turing = (8, 0), (7, 5)
    assert choose_attention("auto", True, "bfloat16", True, ampere) == "flash_attention_2"
    # DTYPE=float32 on CUDA with flash-attn installed used to fail every request.
    assert choose_attention("auto", True, "float32", True, ampere) == "sdpa"
    assert choose_attention("auto", True, "float16", True, turing) == "sdpa"
    assert choose_attention("auto", True, "bfloat16", False, ampere) == "sdpa"
    assert choose_attention("auto", False, "float32", True, (0, 0)) == "sdpa"
    assert choose_attention("eager", False, "float32", False, (0, 0)) == "eager"
    with pytest.raises(ModelLoadError, match="compute capability"):
        choose_attention("flash_attention_2", True, "float32", True, ampere)


def test_duration_groups_keep_similar_lengths_together() -> None:
    second = 16000
    lengths = [25 * second, 3 * second, int(0.3 * second), 12 * second, 26 * second]
    groups = duration_groups(lengths)
    assert sorted(i for g in groups for i in g) == list(range(5))
    for group in groups:
        shortest, longest = min(lengths[i] for i in group), max(lengths[i] for i in group)
        assert longest <= max(2 * shortest, shortest + 2 * second)
    assert [0, 4] in [sorted(g) for g in groups]


def test_short_clips_are_padded_to_half_a_second() -> None:
    assert len(padded(np.ones(100, np.float32))) == 8000
    long = np.ones(9000, np.float32)
    assert padded(long) is long


@pytest.fixture(scope="module")
def aligned_engine(tiny_qwen_dir: Path, tiny_aligner_dir: Path) -> Any:
    engine = QwenEngine(
        str(tiny_qwen_dir), device="cpu", max_new_tokens=8, aligner_id=str(tiny_aligner_dir)
    )
    engine.load()
    yield engine
    engine.unload()


def test_aligner_is_loaded_with_the_model(aligned_engine: QwenEngine) -> None:
    assert aligned_engine._aligner is not None  # not on first use in the inference thread
    assert aligned_engine.dtype == "float32" and aligned_engine.attention == "sdpa"


def test_tiny_aligner_words_join_to_the_transcript(aligned_engine: QwenEngine) -> None:
    rng = np.random.default_rng(1)
    texts, languages = [ENGLISH, CHINESE], ["en", "zh"]
    requests = [
        TranscribeRequest((rng.standard_normal(16000 * 4) * 0.1).astype(np.float32)) for _ in texts
    ]
    words = aligned_engine._align(
        [TranscribeRequest(r.audio, word_timestamps=True) for r in requests],
        texts,
        languages,  # type: ignore[arg-type]
        never_stop,
    )
    for i, text in enumerate(texts):  # random weights: the times are noise, the words are not
        assert join_texts([w.word for w in words[i]]) == text
        assert all(0 <= w.start <= w.end <= 4.0 for w in words[i])


def test_a_batch_of_mixed_lengths_with_word_timestamps(aligned_engine: QwenEngine) -> None:
    rng = np.random.default_rng(2)
    seconds = [25, 3, 0.3, 12, 0.005]  # 0.005 s = 80 samples: the extractor raised before
    requests = [
        TranscribeRequest(
            (rng.standard_normal(int(s * 16000)) * 0.1).astype(np.float32),
            language="en",
            word_timestamps=True,
        )
        for s in seconds
    ]
    results = aligned_engine.transcribe_batch(requests)
    for s, result in zip(seconds, results, strict=True):
        for segment in result.segments:
            assert segment.end == pytest.approx(s)  # the real duration, not the padded one
            # Random weights decode random bytes, whitespace of any kind included: the words
            # keep the text, up to how whitespace between them is written.
            joined = join_texts([w.word for w in segment.words])
            assert not segment.words or "".join(joined.split()) == "".join(segment.text.split())


def renamed_copy(source: Path, target: Path) -> str:
    """The checkpoint with one weight renamed (as a version mismatch would do)."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(source, target)
    weights = load_file(str(target / "model.safetensors"))
    key = sorted(k for k in weights if k.endswith("q_proj.weight"))[0]
    weights[key.replace("q_proj", "query_proj")] = weights.pop(key)
    save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
    return key


def test_a_checkpoint_with_missing_weights_is_refused(tiny_qwen_dir: Path, tmp_path: Path) -> None:
    key = renamed_copy(tiny_qwen_dir, tmp_path / "broken")
    engine = QwenEngine(str(tmp_path / "broken"), device="cpu")
    with pytest.raises(ModelLoadError) as info:
        engine.load()
    assert key in str(info.value) and "missing 1 weights" in str(info.value)


@pytest.mark.slow
def test_missing_weights_are_a_503_naming_them(qwen_settings, tiny_qwen_dir, tmp_path) -> None:  # type: ignore[no-untyped-def]
    key = renamed_copy(tiny_qwen_dir, tmp_path / "broken")
    with live_server(create_app(qwen_settings(model_id=str(tmp_path / "broken")))) as srv:
        response = httpx.post(
            srv.url + "/v1/audio/transcriptions",
            files={"file": ("a.wav", encode(np.zeros(16000, np.float32), 16000, "WAV"))},
            timeout=60,
        )
    assert response.status_code == 503
    assert key in response.json()["error"]["message"]


@pytest.mark.slow
def test_a_clip_of_a_few_samples_is_transcribed_not_a_500(qwen_settings) -> None:  # type: ignore[no-untyped-def]
    with live_server(create_app(qwen_settings())) as srv:
        response = httpx.post(
            srv.url + "/v1/audio/transcriptions",
            files={"file": ("a.wav", encode(np.full(150, 0.1, np.float32), 16000, "WAV"))},
            data={"response_format": "verbose_json"},
            timeout=60,
        )
        assert response.status_code == 200, response.text
        assert response.json()["duration"] == pytest.approx(150 / 16000, abs=1e-3)
        health = srv.get("/health").json()
        assert health["dtype"] == "float32" and health["attention"] == "sdpa"


def test_the_default_model_follows_the_device_torch_sees(monkeypatch: pytest.MonkeyPatch) -> None:
    """An NVIDIA driver without a CUDA torch must not pick the 1.7B model."""
    monkeypatch.setattr("qwen3_asr_server.models.choice.gpu_present", lambda: True)
    tried: list[str] = []

    def offline(path: str, setting: str, **kwargs: Any) -> None:
        tried.append(path)
        raise ModelLoadError("offline")

    monkeypatch.setattr("qwen3_asr_server.engines.qwen.engine.load_checkpoint", offline)
    engine = create_engine(Settings(_env_file=None, device="auto"))  # type: ignore[call-arg]
    assert engine.model_id == "Qwen/Qwen3-ASR-1.7B"  # the guess before loading
    with pytest.raises(ModelLoadError):
        engine.load()  # the real torch here sees no GPU
    assert tried == [DEFAULT_CPU_MODEL] and engine.model_id == DEFAULT_CPU_MODEL


def test_a_row_the_processor_refuses_fails_alone(tiny_qwen_dir: Path) -> None:
    """Rows taken together are prepared together; a prompt the processor refuses (a lone
    surrogate: its tokenizer raises) fails its own row only, and the rows beside it are
    prefilled without it and decode as they would alone (issue 49: every row taken in that
    step failed, another client's final among them)."""
    from test_qwen_steps import Recorder, clips, engine, same

    steps = engine(tiny_qwen_dir, "steps", rows=4)
    try:
        clip = clips()[0]
        good = [TranscribeRequest(audio=clip), TranscribeRequest(audio=clip, language="en")]
        bad = TranscribeRequest(audio=clip, prompt="caf\ud83d")
        alone = [steps.transcribe(r) for r in good]
        source = Recorder([good[0], bad, good[1]])  # all taken at once: one prefill group
        steps.decode_rows(source)
        assert isinstance(source.results[1], Exception), source.results
        for handle, expected in ((0, alone[0]), (2, alone[1])):
            result = source.results[handle]
            assert not isinstance(result, Exception), result
            same(result, expected)
        assert steps._decoder is not None and steps._decoder.rows == []
    finally:
        steps.unload()
