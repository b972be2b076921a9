"""G.711 μ-law and A-law (ITU-T G.711): telephony audio, 8 kHz, one byte a sample.

Decoding is a 256-entry table lookup (numpy only; Python 3.13 removed `audioop`). The
tables hold the 16-bit linear values the standard defines (μ-law ±32124, A-law ±32256).
`encode` quantises to the nearest code: what tests and phone-bridge simulations need.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

RATE = 8000  # Hz: G.711 (mu-law, A-law) is telephony audio, always at 8 kHz

Law = Literal["mulaw", "alaw"]


def _ulaw(code: int) -> int:
    u = ~code & 0xFF
    t = (((u & 0x0F) << 3) + 0x84) << ((u & 0x70) >> 4)
    return 0x84 - t if u & 0x80 else t - 0x84


def _alaw(code: int) -> int:
    a = code ^ 0x55
    t = (a & 0x0F) << 4
    seg = (a & 0x70) >> 4
    if seg == 0:
        t += 8
    elif seg == 1:
        t += 0x108
    else:
        t = (t + 0x108) << (seg - 1)
    return t if a & 0x80 else -t


TABLES: dict[str, np.ndarray] = {
    "mulaw": np.array([_ulaw(c) for c in range(256)], dtype=np.int16),
    "alaw": np.array([_alaw(c) for c in range(256)], dtype=np.int16),
}


def decode(data: bytes, law: Law) -> np.ndarray:
    """G.711 bytes -> float32 samples in [-1, 1) at the same (8 kHz) rate."""
    codes = np.frombuffer(data, dtype=np.uint8)
    return TABLES[law][codes].astype(np.float32) / 32768.0


def decode_pcm16(data: bytes, law: Law) -> bytes:
    """G.711 bytes -> s16le bytes (twice as long)."""
    return TABLES[law][np.frombuffer(data, dtype=np.uint8)].astype("<i2").tobytes()


def encode(samples: np.ndarray, law: Law) -> bytes:
    """float32 samples in [-1, 1] -> G.711 bytes: each sample's nearest code."""
    table = TABLES[law].astype(np.int32)
    order = np.argsort(table, kind="stable")
    values = table[order]
    linear = np.clip(np.round(np.asarray(samples, np.float64) * 32768), -32768, 32767)
    right = np.clip(np.searchsorted(values, linear), 1, len(values) - 1)
    left = right - 1
    nearer = np.where(linear - values[left] <= values[right] - linear, left, right)
    return order[nearer].astype(np.uint8).tobytes()
