"""Qwen3-ASR through the `qwen_asr` SDK (transformers backend). torch and qwen_asr load lazily."""

from __future__ import annotations

import gc
import time
from collections.abc import Hashable
from typing import Any

from ..text import QWEN_LANGUAGES, language_code, language_name
from .base import ModelLoadError, Segment, TranscribeRequest, TranscribeResult

SAMPLE_RATE = 16000


class QwenEngine:
    name = "qwen"

    def __init__(
        self,
        model_id: str,
        *,
        device: str = "auto",
        dtype: str = "auto",
        max_new_tokens: int = 1024,
        cpu_threads: int = 0,
    ) -> None:
        self.model_id = model_id
        self._device_setting = device
        self._dtype_setting = dtype
        self._max_new_tokens = max_new_tokens
        self._cpu_threads = cpu_threads
        self._model: Any = None
        self._device: str | None = None

    @property
    def device(self) -> str:
        return self._device or self._device_setting

    @property
    def languages(self) -> frozenset[str]:
        return frozenset(QWEN_LANGUAGES)

    def load(self) -> None:
        import torch
        import transformers
        from qwen_asr import Qwen3ASRModel

        transformers.logging.set_verbosity_error()  # per-call generate() chatter

        cuda = self._device_setting == "cuda" or (
            self._device_setting == "auto" and torch.cuda.is_available()
        )
        if cuda and not torch.cuda.is_available():
            raise ModelLoadError(
                "DEVICE=cuda but torch sees no CUDA device. Install a CUDA build of torch "
                "or set DEVICE=cpu."
            )
        if self._cpu_threads > 0:
            torch.set_num_threads(self._cpu_threads)
        dtype_name = self._dtype_setting
        if dtype_name == "auto":
            dtype_name = "bfloat16" if cuda else "float32"
        kwargs: dict[str, Any] = {
            "dtype": getattr(torch, dtype_name),
            "device_map": "cuda:0" if cuda else "cpu",
            "attn_implementation": _attention(cuda),
        }
        try:
            model = Qwen3ASRModel.from_pretrained(
                self.model_id, max_new_tokens=self._max_new_tokens, **kwargs
            )
        except Exception as exc:
            raise ModelLoadError(_load_hint(self.model_id, exc)) from exc
        model.model.eval()
        self._model = model
        self._device = "cuda" if cuda else "cpu"

    def unload(self) -> None:
        cuda = self._device == "cuda"
        self._model = None
        self._device = None
        gc.collect()
        if cuda:
            import torch

            torch.cuda.empty_cache()

    def transcribe(self, request: TranscribeRequest) -> TranscribeResult:
        return self.transcribe_batch([request])[0]

    def batch_key(self, request: TranscribeRequest) -> Hashable | None:
        return "qwen"  # the SDK takes a language and a context per item

    def transcribe_batch(self, requests: list[TranscribeRequest]) -> list[TranscribeResult]:
        if self._model is None:
            raise RuntimeError("QwenEngine.transcribe called before load()")
        started = time.perf_counter()
        # Never a string: the SDK treats strings as paths, URLs (fetched!) or base64.
        results = self._model.transcribe(
            audio=[(r.audio, SAMPLE_RATE) for r in requests],
            context=[r.prompt or "" for r in requests],
            language=[language_name(r.language) for r in requests],
        )
        share = (time.perf_counter() - started) / len(requests)
        out = []
        for request, result in zip(requests, results, strict=True):
            text = (result.text or "").strip()
            duration = len(request.audio) / SAMPLE_RATE
            out.append(
                TranscribeResult(
                    text=text,
                    language=language_code(result.language) or request.language,
                    segments=[Segment(start=0.0, end=duration, text=text)] if text else [],
                    engine_seconds=share,
                )
            )
        return out


def _attention(cuda: bool) -> str:
    if not cuda:
        return "sdpa"
    try:
        import flash_attn  # noqa: F401
    except Exception:
        return "sdpa"
    return "flash_attention_2"


def _load_hint(model_id: str, exc: Exception) -> str:
    reason = f"{type(exc).__name__}: {exc}".strip()
    if len(reason) > 400:
        reason = reason[:400] + "..."
    return (
        f"Could not load the Qwen3-ASR model {model_id!r} ({reason}). "
        "If this machine is offline, download the model where it has internet "
        f"(`huggingface-cli download {model_id}`) and copy the HF cache here, or set MODEL_ID "
        "to a local model directory. MODEL_ID=whisper-tiny.en serves the bundled offline "
        "model instead."
    )
