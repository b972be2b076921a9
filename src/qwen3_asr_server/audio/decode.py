"""Decode uploads into mono float32 at 16 kHz; PCM helpers.

soundfile handles wav/flac/ogg; PyAV handles MP3 (libsndfile trusts its Xing header's frame
count) and what soundfile cannot (m4a, mp4, webm, ...).
Raw `audio/pcm` uploads are s16le, 16 kHz, mono. An upload is read from its (spooled)
file, so its bytes are not held in memory beside the decoded audio. `reserve` is told the
decoded duration before each block is kept (the decoded-audio budget grows with it and
may stop the decoding), since a container's header may lie about the duration.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
import soundfile as sf
import soxr

from ..errors import BadRequestError, InvalidAudioError, ServiceError, TooLargeError
from .pcm import SAMPLE_RATE, finite

PCM_TYPES = {"audio/pcm", "audio/l16", "audio/x-raw", "audio/raw"}
PCM_SUFFIXES = (".pcm", ".raw", ".s16le")


@dataclass(frozen=True)
class Audio:
    samples: np.ndarray  # float32, mono, 16 kHz
    source_rate: int

    @property
    def duration(self) -> float:
        return len(self.samples) / SAMPLE_RATE


def pcm16_to_float(data: bytes) -> np.ndarray:
    """s16le bytes -> float32 in [-1, 1]. A trailing odd byte is dropped."""
    usable = len(data) - (len(data) % 2)
    return np.frombuffer(data[:usable], dtype="<i2").astype(np.float32) / 32768.0


def is_raw_pcm(content_type: str | None, filename: str | None) -> bool:
    ctype = (content_type or "").split(";")[0].strip().lower()
    return ctype in PCM_TYPES or (filename or "").lower().endswith(PCM_SUFFIXES)


Source = bytes | BinaryIO  # the upload's bytes, or a seekable file holding them
Reserve = Callable[[float], None]  # seconds decoded so far; raises to stop the decoding


def no_reserve(seconds: float) -> None:
    pass


def rewound(source: Source) -> BinaryIO:
    """A file positioned at the start of the upload (bytes are wrapped, not copied)."""
    if isinstance(source, bytes):
        return io.BytesIO(source)
    source.seek(0)
    return source


def _size(source: Source) -> int:
    if isinstance(source, bytes):
        return len(source)
    return source.seek(0, io.SEEK_END)


def decode_audio(
    source: Source,
    *,
    content_type: str | None = None,
    filename: str | None = None,
    max_seconds: float | None = None,
    reserve: Reserve = no_reserve,
) -> Audio:
    """Decode any supported upload to mono float32 16 kHz, or raise a ServiceError (also the
    one `reserve` raises, before the block that would pass the budget is kept)."""
    size = _size(source)
    if not size:
        raise BadRequestError("The uploaded file is empty.", param="file", code="empty_file")
    if is_raw_pcm(content_type, filename):
        reserve(size // 2 / SAMPLE_RATE)
        audio = Audio(pcm16_to_float(rewound(source).read()), SAMPLE_RATE)
    else:
        audio = _decode_container(source, max_seconds, reserve)
    if len(audio.samples) == 0:
        raise BadRequestError("The audio contains no samples.", param="file", code="empty_audio")
    check_duration(audio.duration, max_seconds)
    return audio


MP3_LENGTH_TAGS = (b"Xing", b"Info", b"VBRI")


def mp3_states_length(source: Source) -> bool:
    """Whether an MP3 says its length: a Xing, Info or VBRI header in its first frame.
    Without one, libsndfile and FFmpeg guess it from the first frames' bitrate, and a quiet
    start makes that guess several times too long."""
    kept = None if isinstance(source, bytes) else source.tell()  # PyAV may be reading it
    try:
        head = rewound(source).read(16384)
        start = 0
        if head[:3] == b"ID3" and len(head) >= 10:  # an ID3v2 tag first: its size, synchsafe
            start = 10 + sum((b & 0x7F) << (7 * (3 - i)) for i, b in enumerate(head[6:10]))
            head = rewound(source).read(start + 4096)
    finally:
        if kept is not None and not isinstance(source, bytes):
            source.seek(kept)
    return any(tag in head[start : start + 4096] for tag in MP3_LENGTH_TAGS)


def stated_seconds(container: Any, source: Source) -> float | None:
    """The duration a PyAV container states, None where FFmpeg only guessed it from the
    bitrate: raw AAC (ADTS has no length field) and MP3 without a length header."""
    name = container.format.name
    if name == "aac" or (name == "mp3" and not mp3_states_length(source)):
        return None
    if container.duration and container.duration > 0:
        return float(container.duration / 1_000_000)  # microseconds
    return None


def probe_seconds(
    source: Source, *, content_type: str | None = None, filename: str | None = None
) -> float | None:
    """The duration the container's header states, without decoding; None when it does not
    say, or only guesses (or the bytes are not audio: decoding reports that)."""
    if is_raw_pcm(content_type, filename):
        return _size(source) // 2 / SAMPLE_RATE
    try:
        info = sf.info(rewound(source))
        if info.format == "MP3" and not mp3_states_length(source):
            return None
        if info.frames > 0 and info.samplerate > 0:
            return float(info.frames / info.samplerate)
    except Exception:
        pass
    try:
        import av

        with av.open(rewound(source), mode="r") as container:
            return stated_seconds(container, source)
    except Exception:
        pass
    return None


def check_duration(seconds: float, max_seconds: float | None, *, stated: bool = True) -> None:
    """413 past MAX_AUDIO_SECONDS: for a length the header states, or (`stated` False) for
    audio whose decoding has just passed the limit, whatever its real length."""
    if max_seconds is None or seconds <= max_seconds:
        return
    if stated:
        message = f"Audio is {seconds:.1f} s long; the limit is {max_seconds:g} s"
    else:
        message = f"Audio is longer than the limit of {max_seconds:g} s (decoding stopped there)"
    raise TooLargeError(f"{message} (MAX_AUDIO_SECONDS).", param="file")


class Growing:
    """A float32 buffer filled block by block: one allocation when the length is known up
    front, doubling otherwise. `result()` is a view, so the decoded audio exists once.
    Each block is first announced to `reserve` (and to the MAX_AUDIO_SECONDS check)."""

    def __init__(
        self, capacity: int, reserve: Reserve = no_reserve, max_seconds: float | None = None
    ) -> None:
        self._buf = np.empty(max(capacity, SAMPLE_RATE), dtype=np.float32)
        self._len = 0
        self._reserve = reserve
        self._max_seconds = max_seconds

    def add(self, block: np.ndarray) -> None:
        need = self._len + len(block)
        if len(block):
            check_duration(need / SAMPLE_RATE, self._max_seconds, stated=False)
            self._reserve(need / SAMPLE_RATE)
        if need > len(self._buf):
            grown = np.empty(max(need, 2 * len(self._buf)), dtype=np.float32)
            grown[: self._len] = self._buf[: self._len]
            self._buf = grown
        self._buf[self._len : need] = finite(block)
        self._len = need

    def __len__(self) -> int:
        return self._len

    def result(self) -> np.ndarray:
        if len(self._buf) > self._len + self._len // 4 + SAMPLE_RATE:  # grown by doubling
            self._buf = self._buf[: self._len].copy()  # give the unused half back
        return self._buf[: self._len]


def _mono(block: np.ndarray) -> np.ndarray:
    return block.mean(axis=1, dtype=np.float32) if block.shape[1] > 1 else block[:, 0]


def _decode_container(source: Source, max_seconds: float | None, reserve: Reserve) -> Audio:
    try:
        info = sf.info(rewound(source))
    except Exception as sf_error:  # soundfile cannot read it: try FFmpeg through PyAV
        first_error = str(sf_error).rsplit(": ", 1)[-1]
        return _decode_with_av(source, max_seconds, reserve, first_error=first_error)
    if info.format == "MP3":  # libsndfile stops at the Xing header's frame count, which may
        # lie (60 s of audio under a header saying 0.28 s decoded as 0.28 s); FFmpeg decodes
        # every frame there is
        return _decode_with_av(source, max_seconds, reserve, first_error="")
    if info.frames > 0:  # some formats report no frame count until decoded
        check_duration(info.frames / info.samplerate, max_seconds)
    rate = int(info.samplerate)
    out = Growing(int(info.frames * SAMPLE_RATE / rate) + SAMPLE_RATE, reserve, max_seconds)
    resampler = soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32")
    try:
        with sf.SoundFile(rewound(source)) as f:
            for block in f.blocks(blocksize=rate * 10, dtype="float32", always_2d=True):
                mono = _mono(finite(block))  # before the resampler can spread a NaN
                out.add(mono if rate == SAMPLE_RATE else resampler.resample_chunk(mono))
    except ServiceError:  # longer than MAX_AUDIO_SECONDS, or past the budget
        raise
    except Exception as exc:
        raise InvalidAudioError(f"Could not decode the audio: {exc}", param="file") from exc
    if rate != SAMPLE_RATE:
        out.add(resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True))
    return Audio(out.result(), rate)


def _decode_with_av(
    source: Source, max_seconds: float | None, reserve: Reserve, first_error: str
) -> Audio:
    import av  # PyAV: FFmpeg bindings, imported only for formats soundfile cannot read

    try:
        with av.open(rewound(source), mode="r") as container:
            if not container.streams.audio:
                raise InvalidAudioError("The file has no audio stream.", param="file")
            stream = container.streams.audio[0]
            source_rate = int(stream.rate or SAMPLE_RATE)
            # the header's duration, which may lie: `out` checks every block it is given;
            # a guessed one (raw AAC, MP3 without a length header) is not even a size hint
            seconds = stated_seconds(container, source) or 0.0
            out = Growing(int(seconds * SAMPLE_RATE) + SAMPLE_RATE, reserve, max_seconds)
            resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
            for frame in container.decode(stream):
                for chunk in resampler.resample(frame):
                    out.add(chunk.to_ndarray().reshape(-1))
            for chunk in resampler.resample(None):
                out.add(chunk.to_ndarray().reshape(-1))
    except ServiceError:  # no audio stream, longer than MAX_AUDIO_SECONDS, or past the budget
        raise
    except Exception as exc:
        raise InvalidAudioError(
            f"Could not decode the audio: not a supported audio format (soundfile: "
            f"{first_error}; ffmpeg: {str(exc).split(':')[0]}).",
            param="file",
        ) from exc
    return Audio(out.result(), source_rate)
