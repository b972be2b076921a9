"""The first bytes of a live /v1/listen stream opened without `encoding` (Deepgram's docs: leave
`encoding` and `sample_rate` out for containerized audio). A WAV header is read (its rate,
channels and format: 16-bit PCM, μ-law or A-law, plain or WAVE_FORMAT_EXTENSIBLE) and taken
off the audio; a compressed container or codec (WebM, Ogg, FLAC, MP3, AAC, MP4) is named, as
it is not decoded live; anything else is raw audio. Pure byte arithmetic on a bounded
header. POST /v1/listen with `encoding` and raw audio: the WAV header that makes it a file
(`wav_for_raw`)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ...streaming.ingest import Encoding

WAV_FORMATS: dict[int, tuple[Encoding, int]] = {
    1: ("pcm_s16le", 16),
    6: ("alaw", 8),
    7: ("mulaw", 8),
}
EXTENSIBLE = 0xFFFE
MAX_HEADER = 65536  # a WAV whose data chunk starts later is refused
# MPEG audio layer III bitrates (kbit/s, index 1-14): MPEG-1, then MPEG-2/2.5
MP3_KBPS = (
    (32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
)
MP3_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


class Undecodable(ValueError):
    """Audio this stream cannot decode (closed with 1008 `DATA-0000`)."""


@dataclass(frozen=True)
class WavFormat:
    encoding: Encoding
    sample_rate: int
    channels: int
    header: int  # bytes before the audio


def is_wav(head: bytes) -> bool:
    return head[:4] in (b"RIFF", b"RF64") and head[8:12] == b"WAVE"


def compressed(head: bytes) -> str | None:
    """The compressed container or codec the stream's first bytes begin, if any."""
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "WebM/Matroska"
    if head[:4] in (b"OggS", b"fLaC"):
        return "Ogg" if head[:4] == b"OggS" else "FLAC"
    if head[:3] == b"ID3":
        return "MP3"
    if head[4:8] == b"ftyp":
        return "MP4/M4A"
    if (length := frame_length(head, 0)) and frame_length(head, length):
        return "MP3/AAC"  # (two frames in a row: raw PCM rarely looks like one, never two)
    return None


def frame_length(data: bytes, at: int) -> int | None:
    """The length of the MPEG layer III or ADTS (AAC) frame whose header is at `at`."""
    if len(data) < at + 7 or data[at] != 0xFF or data[at + 1] & 0xE0 != 0xE0:
        return None
    b1, b2 = data[at + 1], data[at + 2]
    if b1 & 0xF6 == 0xF0:  # ADTS: MPEG-4/2 AAC, layer 00
        length = ((data[at + 3] & 3) << 11) | (data[at + 4] << 3) | (data[at + 5] >> 5)
        return length if length > 7 and (b2 >> 2) & 0xF < 13 else None
    version, layer = (b1 >> 3) & 3, (b1 >> 1) & 3
    kbps_index, rate_index = b2 >> 4, (b2 >> 2) & 3
    if version == 1 or layer != 1 or kbps_index in (0, 15) or rate_index == 3:
        return None
    kbps = MP3_KBPS[version != 3][kbps_index - 1]
    rate = MP3_RATES[version][rate_index]
    return (144 if version == 3 else 72) * kbps * 1000 // rate + ((b2 >> 1) & 1)


def wav_header(data: bytes) -> WavFormat | None:
    """A WAV's format and where its audio starts; None: more bytes are needed (its data
    chunk not reached yet). Raises Undecodable for a format we do not stream. The data
    chunk's size is not read (a live WAV writer leaves it 0 or 0xFFFFFFFF)."""
    pos, found = 12, None
    while pos + 8 <= len(data):
        chunk, size = data[pos : pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        body = pos + 8
        if chunk == b"data":
            if found is None:
                raise Undecodable("The WAV header has no `fmt ` chunk before its audio.")
            return WavFormat(*found, header=body)
        if chunk == b"fmt ":
            if size < 16:
                raise Undecodable(f"The WAV's `fmt ` chunk has {size} bytes (at least 16).")
            if len(data) < body + min(size, 26):
                return None
            tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", data, body)
            if tag == EXTENSIBLE and size >= 26:
                tag = struct.unpack_from("<H", data, body + 24)[0]  # (its subformat's code)
            if WAV_FORMATS.get(tag, (None, 0))[1] != bits:
                raise Undecodable(
                    f"This WAV's audio (format {tag}, {bits}-bit) is not decoded live: "
                    "send 16-bit PCM, μ-law or A-law, or POST the file to /v1/listen."
                )
            found = (WAV_FORMATS[tag][0], rate, channels)
        pos = body + size + (size & 1)
    if len(data) > MAX_HEADER:
        raise Undecodable(f"No WAV audio within the first {MAX_HEADER} bytes.")
    return None


def wav_for_raw(encoding: Encoding, rate: int, channels: int, size: int) -> bytes:
    """The header of a WAV whose data is `size` bytes of raw `encoding` audio."""
    tag, bits = next((t, b) for t, (e, b) in WAV_FORMATS.items() if e == encoding)
    width = bits // 8 * channels
    fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * width, width, bits)
    if tag != 1:
        fmt += b"\0\0"  # (cbSize: a non-PCM format's fmt chunk is 18 bytes)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", size)
    return b"RIFF" + struct.pack("<I", len(body) + size) + body
