"""The two ways `qwen3-asr-server transcribe` turns a file into output bodies: `Local` (the
server's own pipeline in this process) and `Remote` (a running server through the `openai`
SDK, the body it answers as it is)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import Settings

FORMATS = {  # --format -> (the API's response_format, the output file's suffix)
    "txt": ("text", ".txt"),
    "srt": ("srt", ".srt"),
    "vtt": ("vtt", ".vtt"),
    "json": ("json", ".json"),
    "verbose_json": ("verbose_json", ".verbose.json"),
}
Progress_ = Callable[[float], None]  # audio seconds of the file done so far


@dataclass
class Job:
    path: Path
    outputs: dict[str, Path]  # format -> file to write
    seconds: float = 0.0  # the header's duration (0: unknown until decoded)
    error: str = ""
    written: list[Path] = field(default_factory=list)


@dataclass
class Calls:
    """--multichannel: one speaker per channel, with the channels' names (None: numbered)."""

    names: list[str] | None = None


class Local:
    """The server's pipeline in this process: engine, model manager, scheduler, segmenter."""

    def __init__(self, settings: Settings, calls: Calls | None = None) -> None:
        self.settings = settings
        self.calls = calls

    async def __aenter__(self) -> Local:
        from ..audio.segmentation import Segmenter
        from ..audio.vad import SileroModel
        from ..engines import create_engine
        from ..models.plan import plan_model, precheck
        from ..runtime.lifecycle import ModelManager
        from ..runtime.scheduler import PriorityScheduler
        from ..transcription.service import Transcriber

        s = self.settings
        plan = plan_model(s)
        engine = create_engine(plan.settings)
        self.scheduler = PriorityScheduler(
            s.max_queue, max_batch=s.max_batch_size, workers=engine.capacity
        )
        self.scheduler.start()
        self.manager = ModelManager(
            engine,
            idle_timeout=0,
            busy=lambda: self.scheduler.busy,
            download=plan.background(),
            fallback=plan.fallback,
            precheck=precheck,
        )
        self.vad = SileroModel()
        segmenter = Segmenter(s.segment_max_seconds, self.vad if s.segment_vad else None)
        self.transcriber = Transcriber(s, self.manager, self.scheduler, segmenter)
        await self.manager.start()
        download = self.manager.download
        if download is not None:  # a command line waits for it, until it fails once
            print(f"downloading {', '.join(download.repos)} first ...", flush=True)
            while not download.finished.is_set():
                if download.state == "failed":
                    await self.__aexit__()
                    raise SystemExit(
                        f"could not download {download.repos[0]} ({download.error}). Run "
                        f"`qwen3-asr-server download {download.repos[0]}` where there is "
                        "internet, or set MODEL_ID to a local model directory."
                    )
                with suppress(TimeoutError):
                    await asyncio.wait_for(download.finished.wait(), 0.5)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.scheduler.stop)
        await self.manager.stop()
        self.vad.close()

    async def transcribe(
        self, job: Job, formats: list[str], language: str | None, progress: Progress_
    ) -> dict[str, bytes]:
        from ..audio.decode import decode_audio
        from ..audio.vad import fill_no_speech_probs
        from ..errors import ModelLoadError
        from ..outputs.formats import BodyWishes, render
        from ..transcription.long_form import merge
        from ..transcription.service import Options

        if self.calls is not None:
            return await self._channels(job, formats, language, progress)

        def decode() -> Any:
            with job.path.open("rb") as f:
                return decode_audio(
                    f, filename=job.path.name, max_seconds=self.settings.max_audio_seconds
                )

        audio = await asyncio.to_thread(decode)
        job.seconds = audio.duration
        bodies: dict[str, bytes] = {}
        done: list[tuple[bool, Any]] = []  # (segment times, transcript)
        for fmt in formats:
            response_format = FORMATS[fmt][0]
            # as the route decides: text-only formats decode without segment times
            times = response_format not in ("json", "text")
            options = Options(self.transcriber.decoding(language=language, segment_times=times))
            # json/text and srt/vtt/verbose_json decode alike: one transcription each
            result = next((r for t, r in done if t == times), None)
            if result is None:
                parts = []
                async for part in self.transcriber.stream(audio, options):
                    parts.append(part)
                    progress(part.span.end_s)
                result = merge(parts, audio, options.request.language)
                if "verbose_json" in formats and times:  # as the route does (no VAD: 0.0)
                    with suppress(ModelLoadError):
                        await asyncio.to_thread(
                            fill_no_speech_probs, self.vad, audio.samples, result.segments
                        )
                done.append((times, result))
            bodies[fmt] = render(result, response_format, BodyWishes())[0]
        return bodies

    async def _channels(
        self, job: Job, formats: list[str], language: str | None, progress: Progress_
    ) -> dict[str, bytes]:
        """--multichannel: each channel on its own, merged by time, as the route does."""
        from ..audio.channels import decode_channels
        from ..outputs.formats import BodyWishes, render
        from ..transcription.channels import channel_names, transcribe_channels
        from ..transcription.service import Options

        assert self.calls is not None

        def decode() -> Any:
            with job.path.open("rb") as f:
                return decode_channels(f, max_seconds=self.settings.max_audio_seconds)

        tracks = await asyncio.to_thread(decode)
        job.seconds = tracks[0].duration
        names = channel_names(self.calls.names, len(tracks))
        options = Options(self.transcriber.decoding(language=language))
        result = await transcribe_channels(self.transcriber, tracks, options, names)
        progress(job.seconds)
        return {f: render(result, FORMATS[f][0], BodyWishes())[0] for f in formats}


class Remote:
    """A running server through the openai SDK: the body it answers, as it is."""

    def __init__(
        self, url: str, api_key: str | None, model: str | None = None, calls: Calls | None = None
    ) -> None:
        self.calls = calls
        self.model = model or "whisper-1"  # --model (MODEL_ID): vLLM wants its own name
        base = url.rstrip("/")
        self.base_url = base if base.endswith("/v1") else base + "/v1"
        self.api_key = api_key or "unused"  # a server without API_KEY takes any

    async def __aenter__(self) -> Remote:
        try:
            from openai import AsyncOpenAI
        except ImportError:  # the `translate` extra brings it
            raise SystemExit(
                "transcribe --server needs the openai SDK: pip install openai"
            ) from None

        self.client = AsyncOpenAI(
            base_url=self.base_url, api_key=self.api_key, max_retries=2, timeout=3600
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()

    @property
    def create(self) -> Any:  # the raw body, whatever the format
        return self.client.audio.transcriptions.with_raw_response.create

    async def transcribe(
        self, job: Job, formats: list[str], language: str | None, progress: Progress_
    ) -> dict[str, bytes]:
        data = await asyncio.to_thread(job.path.read_bytes)
        bodies = {}
        for fmt in formats:
            fields: dict[str, Any] = {"model": self.model, "file": (job.path.name, data)}
            fields["response_format"] = FORMATS[fmt][0]
            if language:
                fields["language"] = language
            if self.calls is not None:
                extra: dict[str, Any] = {"multichannel": "true"}
                if self.calls.names:
                    extra["channel_names"] = self.calls.names
                fields["extra_body"] = extra
            raw = await self.create(**fields)
            bodies[fmt] = raw.http_response.content
        progress(job.seconds)
        return bodies
