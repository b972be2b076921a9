"""Qwen3-ASR through the `qwen_asr` SDK (transformers backend). torch and qwen_asr load lazily."""

from __future__ import annotations

import gc
import time
from collections.abc import Hashable
from typing import Any

from loguru import logger

from ..text import QWEN_LANGUAGES, language_code, language_name
from .base import (
    JobCancelledError,
    ModelLoadError,
    Segment,
    ShouldStop,
    TranscribeRequest,
    TranscribeResult,
    Word,
    never_stop,
)

SAMPLE_RATE = 16000
# The languages Qwen3-ForcedAligner aligns (ISO codes).
ALIGNER_LANGUAGES = frozenset({"zh", "en", "yue", "fr", "de", "it", "ja", "ko", "pt", "ru", "es"})
# The SDK's hard-coded end-of-sequence ids (<|im_end|>, <|endoftext|>).
EOS_IDS = (151645, 151643)


def token_budget(seconds: float, max_new_tokens: int) -> int:
    """Tokens a decode of `seconds` of audio may generate: speech rarely exceeds ~8 tokens
    per second, so this stops a decode that never emits an end token (noise, a broken
    checkpoint) long before MAX_NEW_TOKENS."""
    return max(1, min(max_new_tokens, 32 + int(12 * seconds)))


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
        self._guard: _GenerationGuard | None = None
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
        # Rows that stop early are padded with <|endoftext|> (the SDK leaves pad unset).
        pad = model.processor.tokenizer.convert_tokens_to_ids("<|endoftext|>")
        self._guard = _GenerationGuard(model.model, pad)
        self._model = model
        self._load_kwargs = kwargs
        self._device = "cuda" if cuda else "cpu"

    def unload(self) -> None:
        cuda = self._device == "cuda"
        self._model = None
        self._guard = None
        self._aligner = None
        self._device = None
        gc.collect()
        if cuda:
            import torch

            torch.cuda.empty_cache()

    def transcribe(
        self, request: TranscribeRequest, should_stop: ShouldStop = never_stop
    ) -> TranscribeResult:
        return self.transcribe_batch([request], should_stop)[0]

    def batch_key(self, request: TranscribeRequest) -> Hashable | None:
        return "qwen"  # the SDK takes a language and a context per item

    def transcribe_batch(
        self, requests: list[TranscribeRequest], should_stop: ShouldStop = never_stop
    ) -> list[TranscribeResult]:
        if self._model is None or self._guard is None:
            raise RuntimeError("QwenEngine.transcribe called before load()")
        started = time.perf_counter()
        budgets = [token_budget(len(r.audio) / SAMPLE_RATE, self._max_new_tokens) for r in requests]
        self._model.max_new_tokens = max(budgets)
        with self._guard.limits(budgets, should_stop) as hit:
            # Never a string: the SDK treats strings as paths, URLs (fetched!) or base64.
            results = self._model.transcribe(
                audio=[(r.audio, SAMPLE_RATE) for r in requests],
                context=[r.prompt or "" for r in requests],
                language=[language_name(r.language) for r in requests],
            )
        if should_stop():
            raise JobCancelledError("every caller of this job has gone")
        for index in sorted(hit):
            seconds = len(requests[index].audio) / SAMPLE_RATE
            logger.warning(
                "the decode of {:.1f} s of audio hit its budget of {} tokens without an end "
                "token (noise, or a broken checkpoint?); its text is cut there",
                seconds,
                budgets[index],
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


class _GenerationGuard:
    """Wraps the model's `generate` so that each call stops, per row, at that row's token
    budget, and stops altogether once `should_stop()` says every caller has gone (checked
    every generated token, i.e. within one decode step). The SDK calls `generate` itself, so
    this is where a stopping criterion can go in."""

    def __init__(self, model: Any, pad_token_id: int | None) -> None:
        self._generate = model.generate
        self._pad = pad_token_id
        self._budgets: list[int] = []
        self._should_stop: ShouldStop = never_stop
        self._hit: set[int] = set()
        self._offset = 0
        model.generate = self._guarded

    def limits(self, budgets: list[int], should_stop: ShouldStop) -> _Limits:
        return _Limits(self, budgets, should_stop)

    def _guarded(self, *args: Any, **kwargs: Any) -> Any:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        guard = self
        rows = int(kwargs["input_ids"].shape[0])
        prompt = int(kwargs["input_ids"].shape[1])
        first = self._offset  # the SDK may split one call into several sub-batches
        self._offset += rows
        budgets = torch.tensor(self._budgets[first : first + rows], dtype=torch.long)
        eos = torch.tensor(EOS_IDS)

        class Stop(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **_: Any) -> Any:
                generated = input_ids[:, prompt:]
                done = generated.shape[1] >= budgets.to(input_ids.device)
                ended = torch.isin(generated, eos.to(input_ids.device)).any(dim=1)
                for row in torch.nonzero(done & ~ended).flatten().tolist():
                    guard._hit.add(first + int(row))
                if guard._should_stop():
                    return torch.ones_like(done)
                return done

        criteria = StoppingCriteriaList([Stop(), *(kwargs.pop("stopping_criteria", None) or [])])
        if self._pad is not None:
            kwargs.setdefault("pad_token_id", self._pad)
        return self._generate(*args, stopping_criteria=criteria, **kwargs)


class _Limits:
    def __init__(self, guard: _GenerationGuard, budgets: list[int], should_stop: ShouldStop):
        self._guard = guard
        self._budgets = budgets
        self._should_stop = should_stop

    def __enter__(self) -> set[int]:
        self._guard._budgets = self._budgets
        self._guard._should_stop = self._should_stop
        self._guard._hit = set()
        self._guard._offset = 0
        return self._guard._hit

    def __exit__(self, *_: Any) -> None:
        self._guard._should_stop = never_stop


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
