"""Qwen3-ASR through the `qwen_asr` SDK (transformers backend). torch and qwen_asr load lazily."""

from __future__ import annotations

import gc
import time
from collections.abc import Hashable
from typing import Any

from ..text import QWEN_LANGUAGES, language_code, language_name
from .base import ModelLoadError, Segment, TranscribeRequest, TranscribeResult, Word

SAMPLE_RATE = 16000
# The languages Qwen3-ForcedAligner aligns (ISO codes).
ALIGNER_LANGUAGES = frozenset({"zh", "en", "yue", "fr", "de", "it", "ja", "ko", "pt", "ru", "es"})


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
        aligner_id: str | None = None,
    ) -> None:
        self.model_id = model_id
        self.aligner_id = aligner_id
        self._aligner: Any = None
        self._load_kwargs: dict[str, Any] = {}
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

    @property
    def word_timestamps(self) -> str:
        """`aligner` with FORCED_ALIGNER_ID set, else `estimate` (spread over the segment)."""
        return "aligner" if self.aligner_id else "estimate"

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
        self._load_kwargs = kwargs
        self._device = "cuda" if cuda else "cpu"

    def unload(self) -> None:
        cuda = self._device == "cuda"
        self._model = None
        self._aligner = None
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
            language = language_code(result.language) or request.language
            segment = Segment(start=0.0, end=duration, text=text)
            aligned = self.aligner_id and language in ALIGNER_LANGUAGES
            if text and request.word_timestamps and aligned:
                segment.words = self._align(request, text, str(language))
            out.append(
                TranscribeResult(
                    text=text,
                    language=language,
                    segments=[segment] if text else [],
                    engine_seconds=share,
                )
            )
        return out

    def _align(self, request: TranscribeRequest, text: str, language: str) -> list[Word]:
        """Word (CJK: character) timestamps from Qwen3-ForcedAligner, loaded on first use."""
        if self._aligner is None:
            from qwen_asr.inference.qwen3_forced_aligner import Qwen3ForcedAligner

            try:
                self._aligner = Qwen3ForcedAligner.from_pretrained(
                    self.aligner_id,
                    **{k: v for k, v in self._load_kwargs.items() if k != "attn_implementation"},
                )
            except Exception as exc:
                raise ModelLoadError(
                    _load_hint(str(self.aligner_id), exc, "FORCED_ALIGNER_ID")
                ) from exc
        (result,) = self._aligner.align(
            audio=(request.audio, SAMPLE_RATE), text=text, language=language_name(language)
        )
        duration = len(request.audio) / SAMPLE_RATE
        words, last = [], 0.0
        for item in result.items:  # clamp into the audio and keep time moving forward
            start = min(max(float(item.start_time), last), duration)
            end = min(max(float(item.end_time), start), duration)
            words.append(Word(word=item.text, start=start, end=end))
            last = start
        return words


def _attention(cuda: bool) -> str:
    if not cuda:
        return "sdpa"
    try:
        import flash_attn  # noqa: F401
    except Exception:
        return "sdpa"
    return "flash_attention_2"


def _load_hint(model_id: str, exc: Exception, setting: str = "MODEL_ID") -> str:
    reason = f"{type(exc).__name__}: {exc}".strip()
    if len(reason) > 400:
        reason = reason[:400] + "..."
    return (
        f"Could not load {model_id!r} ({setting}: {reason}). "
        "If this machine is offline, download the model where it has internet "
        f"(`huggingface-cli download {model_id}`) and copy the HF cache here, or set {setting} "
        "to a local model directory. MODEL_ID=whisper-tiny.en serves the bundled offline "
        "model instead."
    )
