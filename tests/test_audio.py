"""Decoding uploads: containers, channels, rates, raw PCM, and the errors."""

from __future__ import annotations

import numpy as np
import pytest

from audio_files import av_bytes, encode, encode_av, quiet_start_speech, tone, wav_bytes
from qwen3_asr_server.api.error_table import http_status, openai_body
from qwen3_asr_server.audio.decode import decode_audio, pcm16_to_float, probe_seconds
from qwen3_asr_server.audio.pcm import SAMPLE_RATE
from qwen3_asr_server.errors import BadRequestError, InvalidAudioError, TooLargeError


@pytest.mark.parametrize(
    ("fmt", "subtype"),
    [("WAV", "PCM_16"), ("FLAC", None), ("OGG", "VORBIS"), ("MP3", "MPEG_LAYER_III")],
)
def test_soundfile_formats_decode_to_16k_mono_float32(fmt: str, subtype: str | None) -> None:
    data = encode(tone(1.0, 44100, channels=2), 44100, fmt, subtype)
    audio = decode_audio(data, filename=f"x.{fmt.lower()}")
    assert audio.samples.dtype == np.float32
    assert audio.samples.ndim == 1
    assert audio.source_rate == 44100
    assert abs(audio.duration - 1.0) < 0.1  # mp3 adds encoder padding
    assert 0.1 < float(np.abs(audio.samples).max()) <= 1.0


@pytest.mark.parametrize(("container", "codec"), [("mp4", "aac"), ("webm", "libopus")])
def test_ffmpeg_formats_decode_through_pyav(container: str, codec: str) -> None:
    data = av_bytes(container, codec, seconds=1.0)
    audio = decode_audio(data, content_type=f"audio/{container}")
    assert audio.samples.dtype == np.float32
    assert abs(audio.duration - 1.0) < 0.15
    assert float(np.abs(audio.samples).max()) > 0.1


def test_stereo_is_mixed_to_mono() -> None:
    left = tone(0.5, 16000)
    stereo = np.stack([left, -left], axis=1)  # opposite phases cancel when mixed
    audio = decode_audio(encode(stereo, 16000, "WAV", "FLOAT"))
    assert float(np.abs(audio.samples).max()) < 1e-6


def test_raw_pcm_is_s16le_16k_mono() -> None:
    pcm = (np.array([0, 16384, -16384, 32767], dtype="<i2")).tobytes() * 4000
    audio = decode_audio(pcm, content_type="audio/pcm")
    assert len(audio.samples) == 16000
    assert audio.samples[1] == pytest.approx(0.5)
    assert decode_audio(pcm, filename="call.pcm").duration == pytest.approx(1.0)


def test_pcm_helper_drops_a_trailing_odd_byte() -> None:
    assert len(pcm16_to_float(b"\x00\x01\x02")) == 1


def test_resampling_keeps_duration() -> None:
    audio = decode_audio(wav_bytes(2.0, rate=8000))
    assert len(audio.samples) == pytest.approx(2 * SAMPLE_RATE, abs=2)


def test_empty_file_is_400() -> None:
    with pytest.raises(BadRequestError) as info:
        decode_audio(b"")
    assert http_status(info.value) == 400 and info.value.param == "file"


def test_garbage_is_400_invalid_audio_with_reason() -> None:
    with pytest.raises(InvalidAudioError) as info:
        decode_audio(bytes(range(256)) * 8, filename="x.wav")
    assert (http_status(info.value), info.value.code, info.value.param) == (
        400,
        "invalid_audio",
        "file",
    )
    assert openai_body(info.value)["error"]["type"] == "invalid_request_error"
    assert "not a supported audio format" in info.value.message


def test_a_file_without_an_audio_stream_is_invalid_audio() -> None:
    with pytest.raises(InvalidAudioError) as info:
        decode_audio(av_bytes("mp4", "aac", seconds=0.5)[:64], filename="x.mp4")
    assert http_status(info.value) == 400 and info.value.code == "invalid_audio"


def test_too_long_is_413_before_full_decode() -> None:
    with pytest.raises(TooLargeError) as info:
        decode_audio(wav_bytes(3.0), max_seconds=2.0)
    assert http_status(info.value) == 413
    assert "MAX_AUDIO_SECONDS" in info.value.message


def test_too_long_through_ffmpeg_is_413() -> None:
    with pytest.raises(TooLargeError):
        decode_audio(av_bytes("mp4", "aac", seconds=3.0), max_seconds=1.0)


def test_an_mp3_whose_xing_header_understates_it_is_decoded_whole() -> None:
    """An MP3's Xing/Info header gives its frame count; libsndfile stops there. A header that
    says 10 frames over 20 s of audio decoded as 0.28 s, the rest lost without an error."""
    import io
    import struct

    import soundfile as sf

    audio = tone(20.0)
    buf = io.BytesIO()
    sf.write(buf, audio, SAMPLE_RATE, format="MP3")
    data = bytearray(buf.getvalue())
    at = data.find(b"Xing") if b"Xing" in data[:200] else data.find(b"Info")
    assert 0 <= at < 200 and struct.unpack(">I", data[at + 4 : at + 8])[0] & 1  # has frames
    data[at + 8 : at + 12] = struct.pack(">I", 10)
    assert sf.info(io.BytesIO(bytes(data))).frames < SAMPLE_RATE  # the header lies
    decoded = decode_audio(io.BytesIO(bytes(data)), filename="a.mp3", content_type="audio/mpeg")
    assert decoded.duration == pytest.approx(20.0, abs=0.1)


@pytest.mark.parametrize(
    ("container", "codec", "muxer"),
    [("adts", "aac", {}), ("mp3", "libmp3lame", {"write_xing": "0"})],
)
def test_a_guessed_duration_is_not_taken_for_the_length(
    container: str, codec: str, muxer: dict[str, str]
) -> None:
    """Raw AAC and MP3 without a length header state no duration: FFmpeg guesses one from
    the first frames' bitrate, 30x too long after a quiet start (issue 41: a 9.3 s file was
    refused as 283 s). Only the decoding bounds their length."""
    import io

    data = encode_av(quiet_start_speech(9.3), container, codec, **muxer)
    assert probe_seconds(io.BytesIO(data)) is None
    decoded = decode_audio(io.BytesIO(data), max_seconds=10.0)  # a file object: PyAV reads
    assert decoded.duration == pytest.approx(9.3, abs=0.15)
    with pytest.raises(TooLargeError) as info:
        decode_audio(io.BytesIO(data), max_seconds=5.0)
    # it names the limit, not how far decoding got as if that were the length
    assert "longer than the limit of 5 s" in info.value.message, info.value.message


def test_an_mp3_with_a_length_header_states_its_length() -> None:
    import io

    data = encode_av(quiet_start_speech(9.3), "mp3", "libmp3lame")
    assert probe_seconds(io.BytesIO(data)) == pytest.approx(9.3, abs=0.05)


def test_nan_and_inf_samples_decode_as_silence() -> None:
    """Issue 49: a float WAV's NaN/Inf samples (whisper made "))))))" of them) decode as 0,
    at the file's rate and through the resampler (which would spread a NaN)."""
    for rate in (SAMPLE_RATE, 44100):
        samples = tone(seconds=1.0, rate=rate).astype(np.float32)
        samples[::101], samples[50::101], samples[70::101] = np.nan, np.inf, -np.inf
        audio = decode_audio(encode(samples, rate, "WAV", "FLOAT"))
        assert np.isfinite(audio.samples).all()
        assert np.abs(audio.samples).max() > 0.1  # the tone is still there
