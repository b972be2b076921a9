"""Transcription service: validate, hold the model, schedule, post-process."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from .audio import SAMPLE_RATE, Audio
from .config import Settings
from .engines.base import Segment, TranscribeRequest, TranscribeResult
from .errors import APIError, BadRequestError, InferenceError
from .lifecycle import ModelManager
from .scheduler import BATCH, PriorityScheduler
from .text import collapse_repetitions, parse_language

MAX_PROMPT_CHARS = 4000


@dataclass
class Transcription:
    text: str
    language: str | None  # ISO code
    duration: float
    segments: list[Segment] = field(default_factory=list)
    engine_seconds: float = 0.0  # inside the engine
    job_seconds: float = 0.0  # queue wait + engine, as the caller saw it


class TranscriptionService:
    def __init__(
        self, settings: Settings, manager: ModelManager, scheduler: PriorityScheduler
    ) -> None:
        self.settings = settings
        self.manager = manager
        self.scheduler = scheduler

    def resolve_language(self, value: str | None) -> str | None:
        """User input -> ISO code the engine accepts, None for auto; 400 otherwise."""
        allowed = self.manager.engine.languages
        try:
            code = parse_language(value)
        except ValueError:
            if allowed is None and value and re.fullmatch(r"[a-z]{2,3}", value.strip().lower()):
                return value.strip().lower()  # an engine that takes any code checks it itself
            raise BadRequestError(
                f"Unsupported language {value!r}. Use an ISO-639-1 code (en, zh, ...), a "
                "language name (English) or auto.",
                param="language",
                code="unsupported_language",
            ) from None
        if code is not None and allowed is not None and code not in allowed:
            raise BadRequestError(
                f"The {self.manager.engine.name} model {self.manager.engine.model_id!r} does not "
                f"support language {value!r}. Supported: {', '.join(sorted(allowed))}, or auto.",
                param="language",
                code="unsupported_language",
            )
        return code

    @staticmethod
    def check_options(prompt: str | None, temperature: float | None) -> None:
        if prompt is not None and len(prompt) > MAX_PROMPT_CHARS:
            raise BadRequestError(
                f"prompt is longer than {MAX_PROMPT_CHARS} characters.", param="prompt"
            )
        if temperature is not None and not 0.0 <= temperature <= 1.0:
            raise BadRequestError("temperature must be between 0 and 1.", param="temperature")

    async def transcribe(
        self,
        audio: Audio,
        *,
        language: str | None = None,
        prompt: str | None = None,
        temperature: float | None = None,
        word_timestamps: bool = False,
        priority: int = BATCH,
    ) -> Transcription:
        """Transcribe decoded audio. `language` is an ISO code from resolve_language()."""
        request = TranscribeRequest(
            audio=audio.samples,
            language=language,
            prompt=prompt or None,
            temperature=temperature,
            word_timestamps=word_timestamps,
        )
        async with self.manager.use() as engine:
            submitted = time.perf_counter()
            try:
                result: TranscribeResult = await self.scheduler.submit(
                    lambda: engine.transcribe(request),
                    priority=priority,
                    timeout=self.settings.request_timeout,
                )
            except APIError:  # queue full, timeout, shutting down
                raise
            except ValueError as exc:  # the engine rejected an argument
                raise BadRequestError(str(exc)) from exc
            except Exception as exc:
                raise InferenceError(f"Transcription failed: {type(exc).__name__}: {exc}") from exc
            job_seconds = time.perf_counter() - submitted
        for segment in result.segments:
            segment.text = collapse_repetitions(segment.text)
        return Transcription(
            text=collapse_repetitions(result.text),
            language=result.language or language,
            duration=len(audio.samples) / SAMPLE_RATE,
            segments=result.segments,
            engine_seconds=result.engine_seconds,
            job_seconds=job_seconds,
        )
