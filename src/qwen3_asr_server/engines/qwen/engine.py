"""Qwen3-ASR through the `qwen_asr` SDK (transformers backend). torch and qwen_asr load lazily."""

from __future__ import annotations

import gc
import time
from collections.abc import Hashable, Sequence
from typing import Any

from loguru import logger

from ...audio.pcm import SAMPLE_RATE
from ...errors import ModelLoadError
from ...text import QWEN_LANGUAGES, collapse_repetitions, language_code
from ...transcript import Segment, Word
from ..base import (
    RowSource,
    ShouldStop,
    TranscribeRequest,
    TranscribeResult,
    never_stop,
)
from ..status import EngineStatus
from .encoder import install
from .generate import duration_groups, generate, prefill_groups, warn_budget
from .guard import EOS_IDS, GenerationGuard, RowSpec, row_spec
from .load import (
    aligned_words,
    choose_attention,
    choose_dtype,
    load_aligner,
    load_checkpoint,
    load_hint,
    quantize_int8,
)
from .loop import Joining, ListSource, run_rows
from .prepare import Preparer
from .rows import Decoder, Row
from .tokens import RowRecord, text_logprobs, usage


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
        attention: str = "auto",
        defaults: tuple[str, str] | None = None,
        quantize: str | None = None,
        setting: str = "MODEL_ID",  # the setting that names it, for load errors
        decode: str = "steps",  # our step loop (rows join between steps) or `generate`
        rows: int = 4,  # rows in flight (MAX_BATCH_SIZE): the static cache's slots
        kv_tokens: int = 1024,  # tokens per row in the static cache (prompt + answer)
        graphs: str = "auto",  # CUDA graphs of the step: auto (on CUDA) or off
    ) -> None:
        self.model_id = model_id
        self._setting = setting
        self._quantize = quantize
        self.aligner_id = aligner_id
        self._aligner: Any = None
        self._device_setting = device
        self._dtype_setting = dtype
        self._attention_setting = attention
        self._defaults = defaults  # (cpu model, cuda model) when MODEL_ID is unset
        self.dtype: str | None = None  # in use, once loaded
        self.attention: str | None = None
        self._max_new_tokens = max_new_tokens
        self._cpu_threads = cpu_threads
        self._model: Any = None
        self._guard: GenerationGuard | None = None
        self._device: str | None = None
        self._decode_setting, self._rows, self._kv_tokens = decode, rows, kv_tokens
        self._graphs = graphs
        self._decoder: Decoder | None = None
        self._preparer: Preparer | None = None

    @property
    def device(self) -> str:
        return self._device or self._device_setting

    @property
    def languages(self) -> frozenset[str]:
        return frozenset(QWEN_LANGUAGES)

    capacity = 1  # one call at a time: the model runs in this process

    def status(self) -> EngineStatus:
        return EngineStatus(self.name, self.model_id, self.device, self.dtype, self.attention)

    @property
    def word_timestamps(self) -> str:
        """`aligner` with FORCED_ALIGNER_ID set, else `estimate` (spread over the segment)."""
        return "aligner" if self.aligner_id else "estimate"

    def load(self) -> None:
        import torch
        import transformers
        from qwen_asr import Qwen3ASRModel

        transformers.logging.set_verbosity_error()  # per-call generate() chatter

        available = torch.cuda.is_available()
        cuda = self._device_setting == "cuda" or (self._device_setting == "auto" and available)
        if cuda and not available:
            raise ModelLoadError(
                "DEVICE=cuda but torch sees no CUDA device. Install a CUDA build of torch "
                "or set DEVICE=cpu."
            )
        if self._defaults is not None:  # the default model follows the device torch sees
            self.model_id = self._defaults[1] if cuda else self._defaults[0]
        if self._cpu_threads > 0:
            torch.set_num_threads(self._cpu_threads)
        dtype = choose_dtype(
            self._dtype_setting, cuda, bool(cuda and torch.cuda.is_bf16_supported())
        )
        attention = choose_attention(
            self._attention_setting,
            cuda,
            dtype,
            transformers.utils.is_flash_attn_2_available(),
            torch.cuda.get_device_capability(0) if cuda else (0, 0),
        )
        kwargs: dict[str, Any] = {
            "dtype": getattr(torch, dtype),
            "device_map": "cuda:0" if cuda else "cpu",
            "attn_implementation": attention,
        }
        try:
            network = load_checkpoint(self.model_id, "MODEL_ID", **kwargs)
            processor = transformers.AutoProcessor.from_pretrained(
                self.model_id, fix_mistral_regex=True
            )
        except ModelLoadError:
            raise
        except Exception as exc:
            raise ModelLoadError(load_hint(self.model_id, exc, self._setting)) from exc
        if self._quantize == "int8":
            if cuda:
                raise ModelLoadError(
                    "QUANTIZE=int8 is implemented on CPU only (dynamic int8 of the decoder); "
                    "on CUDA use DTYPE=bfloat16, or vLLM backends (ENGINE=remote)."
                )
            quantize_int8(network)
        model = Qwen3ASRModel(
            backend="transformers",
            model=network,
            processor=processor,
            max_inference_batch_size=-1,  # our batches are already bounded (MAX_BATCH_SIZE)
            max_new_tokens=self._max_new_tokens,
        )
        model.model.eval()
        install(model.model.thinker, gpu=cuda)  # `generate` gets the windows too
        aligner = load_aligner(self.aligner_id, kwargs) if self.aligner_id else None
        # Rows that stop early are padded with <|endoftext|> (the SDK leaves pad unset).
        pad = model.processor.tokenizer.convert_tokens_to_ids("<|endoftext|>")
        audio_token = model.processor.tokenizer.convert_tokens_to_ids("<|audio_pad|>")
        self._guard = GenerationGuard(model.model, pad, audio_token)
        if self.steps:  # the static cache is allocated now, sized by the settings
            self._decoder = Decoder(
                model,
                self._rows,
                self._kv_tokens,
                graphs=cuda and self._graphs != "off",
                sync_every=8 if cuda else 1,
            )
            if cuda:  # every shape a prefill may take, seen once before any caller
                self._decoder.warm()
            # prompts and log-mel off the inference thread (on a GPU machine its spare cores)
            self._preparer = Preparer(model, self._spec, workers=4 if cuda else 1)
            cache = self._decoder.cache
            logger.info(
                "static KV cache: {} rows x {} tokens, {:.0f} MB (MAX_BATCH_SIZE, KV_CACHE_TOKENS)",
                cache.slots,
                cache.length,
                cache.bytes / 1e6,
            )
        self._model = model
        self._aligner = aligner
        self._device = "cuda" if cuda else "cpu"
        self.dtype, self.attention = dtype, attention

    def unload(self) -> None:
        cuda = self._device == "cuda"
        self._model = None
        self._guard = None
        self._decoder = None
        if self._preparer is not None:
            self._preparer.close()
            self._preparer = None
        self._aligner = None
        self._device = None
        self.dtype = self.attention = None
        gc.collect()
        if cuda:
            import torch

            # cuBLAS holds a workspace per stream it ran on (32 MiB each on Hopper)
            getattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: None)()
            torch.cuda.empty_cache()

    def transcribe(
        self, request: TranscribeRequest, should_stop: ShouldStop = never_stop
    ) -> TranscribeResult:
        return self.transcribe_batch([request], should_stop)[0]

    @property
    def steps(self) -> bool:
        return self._decode_setting == "steps"

    @property
    def long_form_batches(self) -> bool:
        """The step path prefills each row alone and masks each row's attention to its own
        positions: a row decodes as it would alone. `generate` pads a batch, which is not
        shown to decode each item as alone, so a long file's segments go one at a time."""
        return self.steps

    def decode_rows(self, source: RowSource) -> None:
        if self._decoder is None:
            raise RuntimeError("QwenEngine.decode_rows called before load()")
        assert self._preparer is not None
        run_rows(self._decoder, source, self._preparer, self._prefill, self._finish)

    def batch_key(self, request: TranscribeRequest) -> Hashable | None:
        return "qwen"  # the SDK takes a language and a context per item

    def transcribe_batch(
        self, requests: list[TranscribeRequest], should_stop: ShouldStop = never_stop
    ) -> list[TranscribeResult]:
        if self._model is None or self._guard is None:
            raise RuntimeError("QwenEngine.transcribe called before load()")
        if self.steps:
            source = ListSource(requests, should_stop)
            self.decode_rows(source)
            return source.answers()
        return self._generated(requests, should_stop)

    def _spec(self, request: TranscribeRequest, tokenizer: Any = None) -> RowSpec:
        assert self._model is not None  # (`tokenizer`: a preparer thread's own)
        tokenizer = tokenizer or self._model.processor.tokenizer
        return row_spec(request, tokenizer, self._max_new_tokens)

    def _prefill(
        self, joining: Joining, prepared: Sequence[object]
    ) -> list[Row | TranscribeResult | Exception]:
        """The prepared rows prefilled together into the step loop (a row that failed its
        preparation is answered with its error); one too long for the static cache is
        decoded alone by `generate` (answered)."""
        assert self._decoder is not None
        out: list[Row | TranscribeResult | Exception] = [
            r if isinstance(r, Row | Exception) else RuntimeError(repr(r)) for r in prepared
        ]
        rows = [(i, r) for i, r in enumerate(prepared) if isinstance(r, Row)]
        for group in prefill_groups([len(row.request.audio) for _, row in rows]):
            batch = [rows[k] for k in group]
            fitted = self._decoder.prefill([row for _, row in batch])
            for (i, row), fits in zip(batch, fitted, strict=True):
                if not fits:
                    out[i] = self._alone(row, joining[i][2])
        return out

    def _alone(self, row: Row, should_stop: ShouldStop) -> TranscribeResult | Exception:
        """A row too long for the static cache, decoded by `generate`; its failure is its own."""
        tokens = row.record.input_tokens + row.spec.budget
        logger.info("a row of {} tokens does not fit KV_CACHE_TOKENS: alone", tokens)
        try:
            return self._generated([row.request], should_stop)[0]
        except Exception as exc:
            return exc

    def _finish(self, row: Row) -> TranscribeResult:
        from qwen_asr.inference.utils import parse_asr_output

        assert self._model is not None
        raw = self._model.processor.tokenizer.decode(
            row.record.generated, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        language, text = parse_asr_output(raw, user_language=row.forced)
        if row.hit:
            warn_budget(row.request, row.spec.budget)
        text = collapse_repetitions((text or "").strip())
        code = language_code(language) or row.request.language
        words = self._align([row.request], [text], [code], never_stop).get(0, [])
        return self._result(row.request, text, code, row.record, row.seconds, words)

    def _result(
        self,
        request: TranscribeRequest,
        text: str,
        language: str | None,
        record: RowRecord,
        seconds: float,
        words: list[Word],
    ) -> TranscribeResult:
        assert self._model is not None
        tokenizer = self._model.processor.tokenizer
        segment = Segment(0.0, len(request.audio) / SAMPLE_RATE, text, words)
        return TranscribeResult(
            text=text,
            language=language,
            segments=[segment] if text else [],
            engine_seconds=seconds,
            logprobs=text_logprobs(tokenizer, record, EOS_IDS) if request.logprobs else None,
            usage=usage(record),
        )

    def _generated(
        self, requests: list[TranscribeRequest], should_stop: ShouldStop
    ) -> list[TranscribeResult]:
        """The SDK's path (QWEN_DECODE=generate): `generate` on padded batches."""
        started = time.perf_counter()
        texts: list[str] = [""] * len(requests)
        languages: list[str | None] = [None] * len(requests)
        records: list[RowRecord] = [RowRecord() for _ in requests]
        # Items of similar length share a call: upstream saw mixed-length batches corrupt
        # the shorter item on GPU (QwenLM/Qwen3-ASR#207).
        for group in duration_groups([len(r.audio) for r in requests]):
            part = [requests[i] for i in group]
            assert self._model is not None and self._guard is not None
            specs = [self._spec(r) for r in part]
            results, seen = generate(self._model, self._guard, part, specs, should_stop)
            for i, result, record in zip(group, results, seen, strict=True):
                # Clean repetitions before alignment, so that words and text agree.
                texts[i] = collapse_repetitions((result.text or "").strip())
                languages[i] = language_code(result.language) or requests[i].language
                records[i] = record
        words = self._align(requests, texts, languages, should_stop)
        share = (time.perf_counter() - started) / len(requests)
        return [
            self._result(r, texts[i], languages[i], records[i], share, words.get(i, []))
            for i, r in enumerate(requests)
        ]

    def _align(
        self,
        requests: list[TranscribeRequest],
        texts: list[str],
        languages: list[str | None],
        should_stop: ShouldStop,
    ) -> dict[int, list[Word]]:
        if self._aligner is None or should_stop():
            return {}
        return aligned_words(self._aligner, requests, texts, languages)
