"""QUANTIZE=int8 on CPU: the Qwen decoder's linear layers (and LM head) become dynamic int8,
the audio encoder stays float32; GPU-only values are refused at start."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from qwen3_asr_server.config import Settings
from qwen3_asr_server.engines import create_engine
from qwen3_asr_server.engines.base import TranscribeRequest
from streaming_client import load


def settings(**values: object) -> Settings:
    return Settings(_env_file=None, **values)  # type: ignore[arg-type]


def test_int8_quantizes_the_decoder_only_and_still_transcribes(tiny_qwen_dir: Path) -> None:
    import torch

    dynamic = torch.ao.nn.quantized.dynamic.Linear
    engine = create_engine(
        settings(model_id=str(tiny_qwen_dir), max_new_tokens=8, quantize="int8", device="cpu")
    )
    engine.load()
    try:
        thinker = engine._model.model.thinker  # type: ignore[attr-defined]
        modules = list(thinker.model.modules())
        assert any(isinstance(m, dynamic) for m in modules)
        assert not any(type(m) is torch.nn.Linear for m in modules)  # every one quantized
        assert isinstance(thinker.lm_head, dynamic)
        encoder = [m for m in thinker.audio_tower.modules() if isinstance(m, torch.nn.Linear)]
        assert encoder and not any(isinstance(m, dynamic) for m in encoder)
        result = engine.transcribe(TranscribeRequest(load("sentence_02.wav"), "en"))
        assert isinstance(result.text, str) and result.text
    finally:
        engine.unload()


def test_without_quantize_the_decoder_stays_float(tiny_qwen_dir: Path) -> None:
    import torch

    engine = create_engine(settings(model_id=str(tiny_qwen_dir), max_new_tokens=8))
    engine.load()
    try:
        thinker = engine._model.model.thinker  # type: ignore[attr-defined]
        assert not isinstance(thinker.lm_head, torch.ao.nn.quantized.dynamic.Linear)
    finally:
        engine.unload()


def test_gpu_only_values_are_refused_at_start() -> None:
    with pytest.raises(ValidationError, match="CPU only"):
        settings(quantize="int8", device="cuda")
    with pytest.raises(ValidationError, match=r"compute capability 8\.9"):
        settings(quantize="fp8")
    with pytest.raises(ValidationError, match="'int8' or 'fp8'"):
        settings(quantize="nf4")
