"""Multichannel uploads (issue 44): each channel decoded to its own mono 16 kHz track, and
the faint copy of the other side that a call's channel often carries (line echo, 20-30 dB
down) silenced, so it is not transcribed as speech on the wrong channel.

The echo gate works on 20 ms frames: a frame of a channel is silenced where another
channel is at least ECHO_DB louder in the same frame (and speaking) and the frame is a copy
of it (correlated at a delay up to 30 ms). Both sides talking at once keep their audio."""

from __future__ import annotations

from typing import Any

import numpy as np
import soundfile as sf
import soxr

from ..errors import BadRequestError, InvalidAudioError, ServiceError
from .decode import Audio, Growing, Reserve, Source, check_duration, no_reserve, rewound
from .pcm import SAMPLE_RATE, finite

MAX_CHANNELS = 8
ECHO_DB = 15.0  # a frame this much quieter than another channel's is that channel's echo
GATE_FRAME = SAMPLE_RATE // 50  # 20 ms
SPEAKING_RMS = 10 ** (-45 / 20)  # the louder channel must be speaking, not near silence
ECHO_CORRELATION = 0.6  # an echo is a copy: shaped like the louder channel
ECHO_LAGS = tuple(SAMPLE_RATE * ms // 1000 for ms in (0, 2, 5, 10, 20, 30))  # its delay
MAX_LAG = max(ECHO_LAGS)


def decode_channels(
    source: Source, *, max_seconds: float | None = None, reserve: Reserve = no_reserve
) -> list[Audio]:
    """Every channel of the upload as its own mono 16 kHz Audio (2 to MAX_CHANNELS), or a
    ServiceError: 400 naming `multichannel` for a mono file or too many channels."""
    if not rewound(source).read(1):
        raise BadRequestError("The uploaded file is empty.", param="file", code="empty_file")
    try:
        info = sf.info(rewound(source))
    except Exception:
        return _decode_with_av(source, max_seconds, reserve)
    if info.format == "MP3":
        return _decode_with_av(source, max_seconds, reserve)
    count = check_channels(int(info.channels))
    rate = int(info.samplerate)
    outs = [Growing(0, _share(reserve, count), max_seconds) for _ in range(count)]
    resampler = soxr.ResampleStream(rate, SAMPLE_RATE, count, dtype="float32")
    try:
        with sf.SoundFile(rewound(source)) as f:
            for block in f.blocks(blocksize=rate * 10, dtype="float32", always_2d=True):
                block = finite(block)  # before the resampler can spread a NaN
                _add(outs, block if rate == SAMPLE_RATE else resampler.resample_chunk(block))
    except ServiceError:
        raise
    except Exception as exc:
        raise InvalidAudioError(f"Could not decode the audio: {exc}", param="file") from exc
    if rate != SAMPLE_RATE:
        _add(outs, resampler.resample_chunk(np.zeros((0, count), np.float32), last=True))
    return _finish(outs, rate, max_seconds)


def check_channels(count: int) -> int:
    if count < 1:
        raise InvalidAudioError(
            "Could not decode the audio: its header says it has no channels.", param="file"
        )
    if count == 1:
        raise BadRequestError(
            "multichannel=true needs audio with 2 to 8 channels; this file has 1 (mono). "
            "Leave multichannel out for mono audio.",
            param="multichannel",
        )
    if count > MAX_CHANNELS:
        raise BadRequestError(
            f"multichannel=true takes at most {MAX_CHANNELS} channels; this file has {count}.",
            param="multichannel",
        )
    return count


def _share(reserve: Reserve, count: int) -> Reserve:
    """Each channel's buffer reports its own length: the budget holds them all."""
    return lambda seconds: reserve(seconds * count)


def _add(outs: list[Growing], block: np.ndarray) -> None:
    for channel, out in enumerate(outs):
        out.add(np.ascontiguousarray(block[:, channel]))


def _finish(outs: list[Growing], rate: int, max_seconds: float | None) -> list[Audio]:
    tracks = [Audio(out.result(), rate) for out in outs]
    if not len(tracks[0].samples):
        raise BadRequestError("The audio contains no samples.", param="file", code="empty_audio")
    check_duration(tracks[0].duration, max_seconds)
    return tracks


def _decode_with_av(source: Source, max_seconds: float | None, reserve: Reserve) -> list[Audio]:
    import av

    try:
        with av.open(rewound(source), mode="r") as container:
            if not container.streams.audio:
                raise InvalidAudioError("The file has no audio stream.", param="file")
            stream: Any = container.streams.audio[0]
            if stream.codec_context is None:  # a header ffmpeg could not make sense of
                raise InvalidAudioError(
                    "Could not decode the audio: its header names no codec that can be "
                    "decoded (a malformed or unsupported file).",
                    param="file",
                )
            count = check_channels(int(stream.codec_context.channels))
            rate = int(stream.rate or SAMPLE_RATE)
            outs = [Growing(0, _share(reserve, count), max_seconds) for _ in range(count)]
            resampler = av.AudioResampler(format="fltp", layout=stream.layout, rate=SAMPLE_RATE)
            for frame in container.decode(stream):
                for chunk in resampler.resample(frame):
                    _add(outs, chunk.to_ndarray().T)
            for chunk in resampler.resample(None):
                _add(outs, chunk.to_ndarray().T)
    except ServiceError:
        raise
    except Exception as exc:
        raise InvalidAudioError(
            f"Could not decode the audio: not a supported audio format ({exc}).", param="file"
        ) from exc
    return _finish(outs, rate, max_seconds)


def without_echo(
    tracks: list[np.ndarray], pasts: list[np.ndarray] | None = None
) -> list[np.ndarray]:
    """Each track with its echo frames set to zero: frames at least ECHO_DB quieter than
    another track that is speaking, and shaped like it (a scaled, maybe delayed copy:
    normalized correlation ≥ ECHO_CORRELATION at one of ECHO_LAGS). A quieter frame of a
    different sound (the other side talking at the same time) is kept. `pasts`: each
    track's MAX_LAG samples before these (a live stream's previous message), else silence."""
    frames = min(len(t) for t in tracks) // GATE_FRAME
    if frames == 0 or len(tracks) < 2:
        return tracks
    if pasts is None:
        pasts = [np.zeros(MAX_LAG, np.float32)] * len(tracks)
    shaped = [t[: frames * GATE_FRAME].reshape(frames, GATE_FRAME) for t in tracks]
    rms = np.stack([np.sqrt(np.mean(f**2, axis=1)) for f in shaped])
    ratio = 10 ** (ECHO_DB / 20)
    out = []
    for c, track in enumerate(tracks):
        echo = np.zeros(frames, bool)
        for o in range(len(tracks)):
            if o == c:
                continue
            louder = (rms[o] >= SPEAKING_RMS) & (rms[c] * ratio <= rms[o])
            if louder.any():
                copy = _correlation(shaped[c], tracks[o], pasts[o], frames) >= ECHO_CORRELATION
                echo |= louder & copy
        cleaned = track.copy()
        cleaned[: frames * GATE_FRAME].reshape(frames, GATE_FRAME)[echo] = 0.0
        out.append(cleaned)
    return out


class EchoGate:
    """without_echo on a live stream's (samples, channels) messages: whole 20 ms frames,
    with each channel's last MAX_LAG samples as the delayed reference across messages. The
    samples of a frame not yet complete wait for the next message (or `rest`)."""

    def __init__(self, channels: int) -> None:
        self._held = np.zeros((0, channels), np.float32)
        self._past = np.zeros((MAX_LAG, channels), np.float32)

    def push(self, samples: np.ndarray) -> np.ndarray:
        samples = np.concatenate([self._held, samples])
        whole = len(samples) - len(samples) % GATE_FRAME
        block, self._held = samples[:whole], samples[whole:]
        if not whole:
            return block
        tracks = [np.ascontiguousarray(block[:, c]) for c in range(block.shape[1])]
        pasts = [self._past[:, c] for c in range(block.shape[1])]
        gated = np.stack(without_echo(tracks, pasts), axis=1)
        self._past = np.concatenate([self._past, block])[-MAX_LAG:]
        return gated

    def rest(self) -> np.ndarray:
        """The incomplete frame, ungated (a flush or the end of the stream)."""
        rest, self._held = self._held, self._held[:0]
        self._past = np.concatenate([self._past, rest])[-MAX_LAG:]
        return rest


def _correlation(frames: np.ndarray, other: np.ndarray, past: np.ndarray, count: int) -> np.ndarray:
    """Per frame, the highest normalized correlation with `other` delayed by ECHO_LAGS
    (`past`: the MAX_LAG samples of it before these)."""
    best = np.zeros(count, np.float32)
    norms = np.linalg.norm(frames, axis=1) + 1e-9
    for lag in ECHO_LAGS:
        shifted = np.concatenate([past[len(past) - lag :], other])[: count * GATE_FRAME]
        theirs = shifted.reshape(count, GATE_FRAME)
        dots = np.einsum("ij,ij->i", frames, theirs)
        best = np.maximum(best, dots / (norms * (np.linalg.norm(theirs, axis=1) + 1e-9)))
    return best
