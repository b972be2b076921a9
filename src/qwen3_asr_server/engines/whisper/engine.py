"""faster-whisper (CTranslate2). CPU-friendly; `whisper-tiny.en` is the bundled offline model.

The server hands the engine the float32 array it has already decoded: faster-whisper's own
decoder calls gc.collect() on every call, which costs ~0.4 s in a large process.
"""

from __future__ import annotations

import functools
import gc
import json
import time
from collections.abc import Hashable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...audio.pcm import SAMPLE_RATE
from ...errors import ModelLoadError
from ...models.choice import resolve_model_path
from ...text import join_texts
from ...transcript import Segment
from ..base import (
    JobCancelledError,
    ShouldStop,
    TranscribeRequest,
    TranscribeResult,
    WholeCalls,
    never_stop,
)
from ..status import EngineStatus
from .batch import batched_decode, to_segment
from .draft import MAX_DRAFT_S, draft_words
from .extras import fitted_prompt, hotwords, pick_language, token_logprobs

MULTILINGUAL_VOCABULARY = 51865  # whisper's vocabulary with its language tokens


def vocabulary_size(folder: Path) -> int | None:
    """Tokens in a CTranslate2 whisper model's vocabulary file (None: no such file)."""
    text_file, json_file = folder / "vocabulary.txt", folder / "vocabulary.json"
    try:
        if text_file.is_file():
            with text_file.open("rb") as f:
                return sum(1 for _ in f)
        if json_file.is_file():
            return len(json.loads(json_file.read_text()))
    except (OSError, ValueError):
        return None
    return None


class WhisperEngine(WholeCalls):
    name = "whisper"
    # Every item of a batched decode is padded to the same 30 s window and decoded alone
    # (tests/test_whisper.py checks that a segment's text is the same in any batch).
    long_form_batches = True

    def __init__(
        self,
        model_id: str,
        *,
        device: str = "auto",
        cpu_threads: int = 0,
        beam_size: int = 5,
        setting: str = "MODEL_ID",  # the setting that names it, for load errors
    ) -> None:
        self.model_id = model_id
        self._setting = setting
        self._device_setting = device
        self._cpu_threads = cpu_threads
        self._beam_size = beam_size
        self._model: Any = None
        self._batched: Any = None
        self._device: str | None = None

    @property
    def device(self) -> str:
        return self._device or self._device_setting

    @property
    def word_timestamps(self) -> str:
        return "native"

    capacity = 1  # one call at a time: the model runs in this process

    def status(self) -> EngineStatus:
        return EngineStatus(self.name, self.model_id, self.device)

    @functools.cached_property
    def english_only(self) -> bool:
        """From the model's files: an English-only whisper has no language tokens, so its
        vocabulary is 51,864 tokens, a multilingual one's 51,865 or more (CTranslate2's own
        test). Only a hub id not on this machine is judged by its name (`*.en`)."""
        try:
            path = Path(resolve_model_path(self.model_id)).expanduser()
        except ModelLoadError:
            path = Path(self.model_id)
        size = vocabulary_size(path) if path.is_dir() else None
        if size is None:
            return self.model_id.lower().rstrip("/").endswith(".en")
        return size < MULTILINGUAL_VOCABULARY

    @property
    def languages(self) -> frozenset[str] | None:
        return frozenset({"en"}) if self.english_only else None

    def load(self) -> None:
        import ctranslate2
        from faster_whisper import BatchedInferencePipeline, WhisperModel

        cuda_count = ctranslate2.get_cuda_device_count()
        cuda = self._device_setting == "cuda" or (self._device_setting == "auto" and cuda_count > 0)
        if cuda and cuda_count == 0:
            raise ModelLoadError("DEVICE=cuda but CTranslate2 sees no CUDA device; set DEVICE=cpu.")
        path = resolve_model_path(self.model_id)
        if Path(path).expanduser().is_dir() and not (Path(path) / "model.bin").is_file():
            raise ModelLoadError(f"{path} holds no CTranslate2 model (model.bin is missing).")
        try:
            self._model = WhisperModel(
                path,
                device="cuda" if cuda else "cpu",
                compute_type="float16" if cuda else "int8",
                cpu_threads=self._cpu_threads,
            )
        except Exception as exc:
            raise ModelLoadError(
                f"Could not load {self.model_id!r} ({self._setting}: {type(exc).__name__}: "
                f"{str(exc)[:300]}), a whisper model. Offline? Set {self._setting} to a local "
                "CTranslate2 model directory or to whisper-tiny.en (bundled)."
            ) from exc
        self._batched = BatchedInferencePipeline(self._model)
        self._device = "cuda" if cuda else "cpu"

    def unload(self) -> None:
        self._model = None
        self._batched = None
        self._device = None
        gc.collect()

    def transcribe(
        self, request: TranscribeRequest, should_stop: ShouldStop = never_stop
    ) -> TranscribeResult:
        if self._model is None:
            raise RuntimeError("WhisperEngine.transcribe called before load()")
        if should_stop():  # nobody waits any more: do not start
            raise JobCancelledError("every caller of this job has gone")
        started = time.perf_counter()
        language = self._language(request)
        if language != request.language:  # chosen among the candidates: batch-able now
            request = replace(request, language=language, languages=())
        if self._drafts(request, language):
            assert language is not None
            words = draft_words(self._model, request.audio, language)
            text = join_texts([word for word, _ in words])
            duration = len(request.audio) / SAMPLE_RATE
            tokens = (  # the draft's text as tokens: what its logprobs score
                self._model.hf_tokenizer.encode(" " + text, add_special_tokens=False).ids
                if request.logprobs and text
                else []
            )
            draft = TranscribeResult(
                text=text,
                language=language,
                segments=[Segment(0.0, duration, text, tokens=tokens)] if text else [],
                engine_seconds=time.perf_counter() - started,
                word_probs=words,
            )
            return self._with_logprobs(request, draft)  # Realtime deltas' logprobs, if asked
        if request.long_form and language is not None:  # the batched decoder needs a language
            return self._with_logprobs(request, self._batch([request], should_stop)[0])
        # One temperature: deterministic output, and no temperature-fallback re-decodes (up
        # to six per window) that multiply CPU latency. An explicit temperature samples.
        temperature = request.temperature or 0.0
        pieces, info = self._model.transcribe(
            request.audio,
            language=language,
            initial_prompt=fitted_prompt(request.prompt, request.keywords),
            hotwords=hotwords(request.keywords),
            temperature=temperature,
            beam_size=1 if request.partial else self._beam_size,  # the final replaces it
            word_timestamps=request.word_timestamps,
            vad_filter=False,
            condition_on_previous_text=False,
        )
        segments = [s for s in _collect(pieces, should_stop) if s.text]
        result = TranscribeResult(
            text=" ".join(s.text for s in segments),
            language=info.language,
            segments=segments,
            engine_seconds=time.perf_counter() - started,
        )
        return self._with_logprobs(request, result)

    def _language(self, request: TranscribeRequest) -> str | None:
        """The forced language; else the likeliest candidate (`languages`); else None
        (detect). An English-only model is always English."""
        if request.language or self.english_only:
            return request.language or "en"
        if request.languages:
            return pick_language(self._model, request.audio, request.languages)
        return None

    def _with_logprobs(
        self, request: TranscribeRequest, result: TranscribeResult
    ) -> TranscribeResult:
        if request.logprobs and result.segments:
            result.logprobs = token_logprobs(
                self._model, request.audio, result.segments, result.language
            )
        elif request.logprobs:
            result.logprobs = []
        return result

    def _drafts(self, request: TranscribeRequest, language: str | None) -> bool:
        """A streaming partial with a known language and plain options: a short window.
        Partials are greedy whatever WHISPER_BEAM_SIZE is (the final replaces them)."""
        return (
            request.draft
            and language is not None
            and not request.prompt
            and not request.keywords
            and not request.temperature
            and not request.word_timestamps
            and len(request.audio) <= MAX_DRAFT_S * SAMPLE_RATE
        )

    def batch_key(self, request: TranscribeRequest) -> Hashable | None:
        language = request.language or ("en" if self.english_only else None)
        if language is None:  # the batched pipeline detects one language for all items
            return None
        return (
            language,
            request.prompt,
            request.keywords,
            request.temperature,
            request.word_timestamps,
            request.segment_times,
        )

    def transcribe_batch(
        self, requests: list[TranscribeRequest], should_stop: ShouldStop = never_stop
    ) -> list[TranscribeResult]:
        """Several ≤30 s requests with the same options in one batched decode."""
        if len(requests) == 1:
            return [self.transcribe(requests[0], should_stop)]
        results = self._batch(requests, should_stop)
        return [self._with_logprobs(r, result) for r, result in zip(requests, results, strict=True)]

    def _batch(
        self, requests: list[TranscribeRequest], should_stop: ShouldStop
    ) -> list[TranscribeResult]:
        if self._batched is None:
            raise RuntimeError("WhisperEngine.transcribe_batch called before load()")
        return batched_decode(self._batched, self._beam_size, requests, should_stop)


def _collect(pieces: Any, should_stop: ShouldStop) -> list[Segment]:
    """Run the segment generator (it does the decoding), stopping between 30 s windows once
    nobody waits for the result."""
    out = []
    for piece in pieces:
        out.append(to_segment(piece))
        if should_stop():
            raise JobCancelledError("every caller of this job has gone")
    return out
