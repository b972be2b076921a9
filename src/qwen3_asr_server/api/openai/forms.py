"""The upload routes' form fields: one pydantic model per route family, taken with
`Annotated[Form, Form()]`, and one conversion each to the service's `Options`.

A field that every upload route shares is declared once (`UploadForm`); the language, prompt
and temperature are checked in one place (`UploadForm.options`) before any audio is read."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Literal

from fastapi import UploadFile
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ...audio.segmentation import CutRules
from ...errors import BadRequestError
from ...outputs.formats import BodyWishes
from ...transcription.service import Options, Transcriber

ResponseFormat = Literal["json", "text", "srt", "vtt", "verbose_json", "diarized_json"]
GRANULARITIES = {"word", "segment"}
STREAMABLE = ("json", "text")  # OpenAI streams these; others answer the normal body


class UploadForm(BaseModel):
    """What every upload route takes."""

    file: UploadFile = Field(description="The audio file.")
    model: str | None = Field(
        None, description="Accepted for compatibility: the served model always answers."
    )
    language: str | None = Field(None, description="ISO-639-1 code, a name, or auto.")
    prompt: str | None = None

    def options(self, transcriber: Transcriber, **fields: Any) -> Options:
        """The service's request, once every field is checked (400 otherwise)."""
        return Options(transcriber.decoding(language=self.language, prompt=self.prompt, **fields))


class ChunkingStrategy(BaseModel):
    """OpenAI's `chunking_strategy` of type server_vad: how a long file is cut here."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["server_vad"]
    prefix_padding_ms: int = Field(300, ge=0, le=5000)
    silence_duration_ms: int = Field(200, ge=0, le=5000)
    threshold: float = Field(0.5, ge=0.0, le=1.0)

    def cut_rules(self) -> CutRules:
        return CutRules(threshold=self.threshold, min_pause_s=self.silence_duration_ms / 1000)


class TranscriptionForm(UploadForm):
    """POST /v1/audio/transcriptions: OpenAI's fields plus the seed's `return_timestamps`."""

    response_format: ResponseFormat = "json"
    temperature: float | None = None
    timestamp_granularities: list[str] | None = Field(None, alias="timestamp_granularities[]")
    stream: bool = False
    return_timestamps: bool = False
    keywords: list[str] | None = Field(None, alias="keywords[]")
    languages: list[str] | None = Field(None, alias="languages[]")
    include: list[str] | None = Field(None, alias="include[]")
    chunking_strategy: str | None = Field(None, description='"auto" or a JSON object.')
    chunking_type: str | None = Field(None, alias="chunking_strategy[type]")
    chunking_threshold: str | None = Field(None, alias="chunking_strategy[threshold]")
    chunking_prefix: str | None = Field(None, alias="chunking_strategy[prefix_padding_ms]")
    chunking_silence: str | None = Field(None, alias="chunking_strategy[silence_duration_ms]")
    diarize: bool = Field(
        False,
        description="Speakers on segments (verbose_json, srt, vtt); diarized_json implies it.",
    )
    known_speaker_names: list[str] | None = Field(None, alias="known_speaker_names[]")
    known_speaker_references: list[str] | None = Field(None, alias="known_speaker_references[]")
    multichannel: bool = Field(
        False,
        description="Each channel (2-8) transcribed on its own and merged by time; segments "
        "carry `channel` and `speaker` (the channel's name). Not with diarize.",
    )
    channel_names: list[str] | None = Field(None, alias="channel_names[]")

    def channels(self) -> bool:
        """multichannel=true, refused with the fields it cannot go with."""
        if not self.multichannel:
            if self.channel_names:
                raise BadRequestError(
                    "channel_names[] needs multichannel=true.", param="channel_names"
                )
            return False
        if self.diarize or self.known_speaker_names or self.known_speaker_references:
            raise BadRequestError(
                "multichannel and diarize cannot be combined: with one speaker per channel the "
                "channel is the speaker. Use multichannel=true (diarized_json then names each "
                "channel's speaker), or diarize=true on a mono mix.",
                param="diarize",
            )
        if "logprobs" in (self.include or []):  # was `"logprobs": []`, and none in a stream
            raise BadRequestError(
                "multichannel and include[]=logprobs cannot be combined: the channels' tokens "
                "interleave in time and have no one order. Transcribe each channel as a mono "
                "file for its logprobs.",
                param="include",
            )
        return True

    def diarizes(self) -> bool:
        """Speakers asked for: `diarized_json`, or `diarize=true` (this server's field) with
        a format that shows them (verbose_json, srt, vtt, or a stream's segment events);
        plain json and text carry none, as for OpenAI's diarize model, so they skip the work.
        Known speakers need one of them."""
        shows = self.response_format not in STREAMABLE or self.streams()
        wanted = self.response_format == "diarized_json" or (self.diarize and shows)
        if not wanted and (self.known_speaker_names or self.known_speaker_references):
            raise BadRequestError(
                "known_speaker_names[] needs response_format=diarized_json, or diarize=true "
                "with verbose_json, srt or vtt.",
                param="known_speaker_names",
            )
        return wanted

    def granularities(self) -> set[str]:
        chosen = {v.strip() for v in self.timestamp_granularities or [] if v.strip()}
        unknown = chosen - GRANULARITIES
        if unknown:
            raise BadRequestError(
                f"Unknown timestamp granularity {sorted(unknown)[0]!r}; use word or segment.",
                param="timestamp_granularities",
            )
        return chosen

    def logprobs(self) -> bool:
        """include[]=logprobs: json only (and its stream), as OpenAI documents."""
        unknown = {v for v in self.include or [] if v != "logprobs"}
        if unknown:
            raise BadRequestError(
                f"Unknown include value {sorted(unknown)[0]!r}; the only one is logprobs.",
                param="include",
            )
        if self.include and self.response_format != "json":
            raise BadRequestError(
                "include[]=logprobs works only with response_format=json.", param="include"
            )
        return bool(self.include)

    def chunking(self) -> CutRules | None:
        """None for "auto" or nothing: the server's own cuts at pauses."""
        fields = {
            "type": self.chunking_type,
            "threshold": self.chunking_threshold,
            "prefix_padding_ms": self.chunking_prefix,
            "silence_duration_ms": self.chunking_silence,
        }
        given = {k: v for k, v in fields.items() if v is not None}
        raw = (self.chunking_strategy or "").strip()
        if raw and raw != "auto":
            try:
                loaded = json.loads(raw)
            except (ValueError, RecursionError):  # nested past the parser's limit
                loaded = None
            if loaded == "auto":  # '"auto"': SDKs that JSON-encode every form field
                loaded = {}
            if not isinstance(loaded, dict):
                raise BadRequestError(
                    'chunking_strategy must be "auto" or an object {"type": "server_vad", ...}.',
                    param="chunking_strategy",
                )
            given = {**loaded, **given}
        if not given:
            return None
        try:
            return ChunkingStrategy.model_validate(given).cut_rules()
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise BadRequestError(
                f"chunking_strategy.{where}: {first['msg']}", param="chunking_strategy"
            ) from None

    def streams(self) -> bool:
        """stream=true for a format that cannot stream answers the normal body, as OpenAI
        does (LiteLLM sends stream=true with verbose_json); diarized_json streams segments."""
        return self.stream and self.response_format in (*STREAMABLE, "diarized_json")

    def words(self) -> bool:
        verbose_words = "word" in self.granularities() and self.response_format == "verbose_json"
        return self.return_timestamps or verbose_words

    def body_wishes(self, options: Options) -> BodyWishes:
        return BodyWishes(
            words=self.words(),
            temperature=options.request.temperature,
            logprobs=options.request.logprobs,
            seed_words=self.return_timestamps,
        )

    def to_options(self, transcriber: Transcriber) -> Options:
        words = self.words() or self.diarizes()  # speaker turns are cut between words
        text_only = self.response_format in STREAMABLE and not words
        options = self.options(
            transcriber,
            languages=self.languages,
            keywords=self.keywords,
            temperature=self.temperature,
            logprobs=self.logprobs(),
            word_timestamps=words,
            segment_times=not text_only,
        )
        return replace(options, cut_rules=self.chunking())


class SeedStreamForm(UploadForm):
    """POST /v1/audio/transcriptions/stream: the seed's SSE endpoint."""

    temperature: float | None = None
    return_timestamps: bool = False

    def to_options(self, transcriber: Transcriber) -> Options:
        return self.options(
            transcriber, temperature=self.temperature, word_timestamps=self.return_timestamps
        )


class SubtitleForm(UploadForm):
    """POST /v1/audio/subtitles: the seed's subtitle endpoint."""

    mode: Literal["fast", "accurate"] = "fast"
    max_line_chars: int = Field(42, ge=10, le=200)
    response_format: Literal["srt", "vtt"] = "srt"
    diarize: bool = Field(False, description="Speaker labels on the cues ([A] / <v A>).")

    def to_options(self, transcriber: Transcriber) -> Options:
        words = self.mode == "accurate" or self.diarize
        return self.options(transcriber, word_timestamps=words)


class TranslationForm(UploadForm):
    """POST /v1/audio/translations: `language` is the target (default en), as the seed had
    it; the source language is detected."""

    language: str | None = Field(None, description="Target language (default en).")
    response_format: Literal["json", "text", "srt", "vtt"] = "json"
    temperature: float | None = None
    max_line_chars: int = Field(42, ge=10, le=200)

    def to_options(self, transcriber: Transcriber) -> Options:
        """The source language is detected: the form's `language` is the target."""
        return Options(transcriber.decoding(prompt=self.prompt, temperature=self.temperature))
