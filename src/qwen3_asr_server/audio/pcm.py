"""The sample rate every layer works in, and the sample math they share.

A bottom module: it imports nothing from the package (numpy only), so engines, the
segmenter, the streaming session and the routers can all use it without an upward arrow.
"""

from __future__ import annotations

import numpy as np

SAMPLE_RATE = 16000  # Hz: audio inside the server is always mono float32 at this rate
ENERGY_HOP = 160  # 10 ms
ENERGY_SMOOTH = 15  # frames: look for a 150 ms quiet stretch, not one quiet sample


def quietest_point(window: np.ndarray) -> int:
    """Sample offset of the centre of the quietest ~150 ms of `window` (energy fallback)."""
    hops = len(window) // ENERGY_HOP
    if hops < ENERGY_SMOOTH:
        return len(window) // 2
    frames = window[: hops * ENERGY_HOP].reshape(hops, ENERGY_HOP)
    energy = np.sqrt(np.mean(frames.astype(np.float64) ** 2, axis=1))
    smooth = np.convolve(energy, np.ones(ENERGY_SMOOTH) / ENERGY_SMOOTH, mode="valid")
    best = int(np.argmin(smooth)) + ENERGY_SMOOTH // 2
    return best * ENERGY_HOP + ENERGY_HOP // 2


def finite(samples: np.ndarray) -> np.ndarray:
    """The samples with every NaN or ±Inf (a float file can hold them) set to 0: silence
    where the file says nothing a sample could be. Whisper turned them into "))))))", and
    a resampler spreads one NaN over its neighbours. A view when all are finite."""
    if np.isfinite(samples).all():
        return samples
    return np.where(np.isfinite(samples), samples, np.float32(0.0)).astype(samples.dtype)
