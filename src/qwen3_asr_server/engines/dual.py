"""DUAL_MODEL: a fast model for streaming partials beside the main model for everything else.

Both load and unload together (the model manager sees one engine). Any pair works: two Qwen
checkpoints, or whisper for partials under a Qwen main model.
"""

from __future__ import annotations

from collections.abc import Hashable

from .base import Engine, ShouldStop, TranscribeRequest, TranscribeResult, never_stop


class DualEngine:
    def __init__(self, main: Engine, fast: Engine) -> None:
        self.main, self.fast = main, fast
        self.name, self.model_id = main.name, main.model_id

    @property
    def device(self) -> str:
        return self.main.device

    @property
    def languages(self) -> frozenset[str] | None:
        return self.main.languages

    @property
    def word_timestamps(self) -> str:
        return self.main.word_timestamps

    @property
    def long_form_batches(self) -> bool:
        return self.main.long_form_batches

    def load(self) -> None:
        self.main.load()
        try:
            self.fast.load()
        except BaseException:
            self.main.unload()  # both or neither: a half-loaded pair would hide the error
            raise

    def unload(self) -> None:
        try:
            self.fast.unload()
        finally:
            self.main.unload()

    def for_request(self, request: TranscribeRequest) -> Engine:
        """Partials go to the fast model, unless it cannot take their language (an
        English-only fast model takes a session only when its language is set to English)."""
        languages = self.fast.languages
        fits = languages is None or (request.language is not None and request.language in languages)
        return self.fast if request.partial and fits else self.main

    def transcribe(
        self, request: TranscribeRequest, should_stop: ShouldStop = never_stop
    ) -> TranscribeResult:
        return self.for_request(request).transcribe(request, should_stop)

    def batch_key(self, request: TranscribeRequest) -> Hashable | None:
        return self.main.batch_key(request)  # partials are never batched

    def transcribe_batch(
        self, requests: list[TranscribeRequest], should_stop: ShouldStop = never_stop
    ) -> list[TranscribeResult]:
        return self.main.transcribe_batch(requests, should_stop)
