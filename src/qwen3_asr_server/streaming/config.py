"""A streaming session's settings (StreamConfig) and what its transcription returns.

The session's decoding wishes (language, candidate languages, prompt, keywords, logprobs)
are one audio-less `TranscribeRequest` template (checked by `decoding.build_decoding`);
every partial and final of the session is decoded with it.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..engines.base import TranscribeRequest
from ..transcript import TokenLogprob, TokenUsage
from .agreement import Draft


@dataclass(frozen=True)
class StreamConfig:
    use_vad: bool = True
    decoding: TranscribeRequest = field(default_factory=TranscribeRequest)
    vad_threshold: float = 0.5
    end_silence_ms: int = 500
    prefix_padding_ms: int = 300
    partial_interval_s: float = 0.45
    window_max_s: float = 15.0
    max_utterance_s: float = 25.0
    flush_silence_ms: int = 600
    max_pending_s: float = 60.0  # audio waiting for its final before feed() waits
    # Server VAD only: after this much audio with no speech (and no open utterance), the
    # session commits an empty item (Realtime's input_audio_buffer.timeout_triggered).
    idle_timeout_ms: int | None = None
    # Live speakers (issue 51): label finals with who speaks them; `split_speakers`: a final
    # whose speaker changes becomes one per speaker (Realtime items keep one, labelled with
    # its main speaker); a final waits at most `speaker_wait_s` for its speaker.
    diarize: bool = False
    split_speakers: bool = True
    speaker_wait_s: float = 0.5

    @property
    def language(self) -> str | None:
        """The forced language (ISO code), None = detect."""
        return self.decoding.language


@dataclass(frozen=True)
class Heard:
    """A final's transcription: its text and what the engine says about it."""

    text: str
    language: str | None = None  # detected (or forced) ISO code
    logprobs: tuple[TokenLogprob, ...] | None = None  # when the template asked for them
    usage: TokenUsage | None = None  # when the engine counted tokens


AudioSource = np.ndarray | Callable[[], np.ndarray]
# (audio or a function that returns it when the job starts, the session's decoding template,
# partial) -> text. A partial may come back as a Draft (words with probabilities); a final
# as text or Heard (text plus detected language, logprobs, token usage).
Transcribe = Callable[
    [AudioSource, TranscribeRequest, bool], Coroutine[Any, Any, str | Draft | Heard]
]
