"""Device handling: a clear error when CUDA is asked for but absent; the CUDA path itself
runs only where a GPU is (skipped here, with the reason)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from qwen3_asr_server.engines.base import TranscribeRequest
from qwen3_asr_server.engines.qwen.engine import QwenEngine
from qwen3_asr_server.engines.whisper.engine import WhisperEngine
from qwen3_asr_server.errors import ModelLoadError


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


@pytest.mark.skipif(cuda_available(), reason="this machine has a GPU")
def test_device_cuda_without_a_gpu_is_a_clear_load_error(tiny_qwen_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="DEVICE=cpu"):
        QwenEngine(str(tiny_qwen_dir), device="cuda").load()
    with pytest.raises(ModelLoadError, match="DEVICE=cpu"):
        WhisperEngine("whisper-tiny.en", device="cuda").load()


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU; none on this machine")
def test_qwen_on_cuda_uses_bf16_and_frees_memory_on_unload(tiny_qwen_dir: Path) -> None:
    import torch

    engine = QwenEngine(str(tiny_qwen_dir), device="cuda", max_new_tokens=4)
    engine.load()
    assert engine.device == "cuda"
    assert engine._model.model.dtype == torch.bfloat16
    engine.transcribe(TranscribeRequest(np.zeros(16000, np.float32)))
    engine.unload()
    assert torch.cuda.memory_allocated() == 0


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU; none on this machine")
def test_qwen_on_cuda_mixed_batch_with_aligner_and_a_failed_request_free_memory(
    tiny_qwen_dir: Path, tiny_aligner_dir: Path
) -> None:
    import torch

    engine = QwenEngine(
        str(tiny_qwen_dir), device="cuda", max_new_tokens=8, aligner_id=str(tiny_aligner_dir)
    )
    engine.load()
    assert engine.attention in ("sdpa", "flash_attention_2") and engine.dtype != "float16"
    requests = [
        TranscribeRequest(np.zeros(int(s * 16000), np.float32) + 0.01, "en", word_timestamps=True)
        for s in (25, 3, 0.3, 12)
    ]
    assert len(engine.transcribe_batch(requests)) == 4

    def explode() -> bool:
        raise RuntimeError("failure mid-decode")

    with pytest.raises(RuntimeError):
        engine.transcribe(TranscribeRequest(np.zeros(32000, np.float32)), explode)
    engine.unload()
    assert torch.cuda.memory_allocated() == 0
