"""Make audio bytes in various containers for tests."""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf


def tone(seconds: float = 1.0, rate: int = 16000, channels: int = 1, freq: float = 440.0):
    t = np.arange(int(seconds * rate)) / rate
    wave = (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)
    return np.stack([wave] * channels, axis=1) if channels > 1 else wave


def encode(samples: np.ndarray, rate: int, fmt: str, subtype: str | None = None) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def speech_samples(seconds: float = 1.0, rate: int = 16000, channels: int = 1) -> np.ndarray:
    """Real speech (the committed espeak-ng sentences, repeated) of exactly this length: audio
    the engine must hear. A tone or silence is not speech, and since issue 41 voice detection
    keeps it from the model."""
    from pathlib import Path

    import soxr

    clip, _ = sf.read(Path(__file__).parent / "data" / "speech" / "three_sentences.wav")
    clip = clip.astype(np.float32)
    if rate != 16000:
        clip = soxr.resample(clip, 16000, rate).astype(np.float32)
    wave = np.tile(clip, int(np.ceil(seconds * rate / len(clip))))[: int(seconds * rate)]
    return np.stack([wave] * channels, axis=1) if channels > 1 else wave


def wav_bytes(seconds: float = 1.0, rate: int = 16000, channels: int = 1) -> bytes:
    """A WAV of real speech (see `speech_samples`)."""
    return encode(speech_samples(seconds, rate, channels), rate, "WAV", "PCM_16")


def av_bytes(container: str, codec: str, seconds: float = 1.0, rate: int = 48000) -> bytes:
    """Encode a tone with FFmpeg (PyAV): m4a/aac, webm/opus, ..."""
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.layout = "mono"
        samples = tone(seconds, rate)
        frame_size = 960
        for i in range(0, len(samples), frame_size):
            chunk = samples[i : i + frame_size].reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(chunk, format="flt", layout="mono")
            frame.sample_rate = rate
            frame.pts = i
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def quiet_start_speech(seconds: float = 9.3, silence: float = 3.0) -> np.ndarray:
    """Real speech after `silence` seconds of silence, 16 kHz, `seconds` long in all."""
    from pathlib import Path

    clip, _ = sf.read(Path(__file__).parent / "data" / "speech" / "three_sentences.wav")
    audio = np.concatenate([np.zeros(int(silence * 16000)), clip, clip, clip])
    return audio[: int(seconds * 16000)].astype(np.float32)


def encode_av(samples: np.ndarray, container: str, codec: str, **muxer: str) -> bytes:
    """16 kHz float audio in one FFmpeg frame -> bytes (`muxer`: the container's options,
    e.g. write_xing="0" for an MP3 without a length header)."""
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container, options=muxer) as out:
        stream = out.add_stream(codec, rate=16000)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="flt", layout="mono")
        frame.rate = 16000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buf.getvalue()
