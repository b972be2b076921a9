"""The diarizer's filterbank features (issue 40): the portable path against senko's own
features on committed audio, and the CPU-flag choice between the two paths."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import speech
from qwen3_asr_server.engines.speakers.fbank import (
    NATIVE_NEEDS,
    choose_features,
    cpu_flags,
    extract,
    missing_for_native,
    window_bounds,
)

REFERENCE = Path(__file__).parent / "data" / "fbank_reference.npz"
# Log-mel values span about ±16 here; the portable path differed from senko's code by at most
# 0.0004 on these windows and 0.0013 on 200 random ones (senko builds with -ffast-math).
TOLERANCE = 0.005
NO_AVX512 = missing_for_native(cpu_flags())


def reference() -> tuple[list[tuple[float, float]], list[np.ndarray]]:
    data = np.load(REFERENCE)
    windows = [(float(a), float(b)) for a, b in data["windows"]]
    return windows, [data[f"window_{i}"] for i in range(len(windows))]


def per_window(flat: np.ndarray, frames: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    return [flat[o : o + n * 80].reshape(n, 80) for n, o in zip(frames, offsets, strict=True)]


def test_portable_features_match_senkos_own() -> None:
    samples, _ = sf.read(speech.path("meeting.wav"), dtype="float32")
    windows, expected = reference()
    flat, frames, offsets, dim = extract(samples, windows)
    assert dim == 80 and flat.dtype == np.float32
    got = per_window(flat, frames, offsets)
    for want, have in zip(expected, got, strict=True):
        assert have.shape == want.shape
        assert np.abs(have - want).max() <= TOLERANCE
    assert max(np.abs(w).max() for w in expected) > 10  # real speech, not zeros


def test_a_window_shifted_by_one_frame_does_not_match() -> None:
    """The tolerance is tight enough to see a window cut 10 ms off."""
    samples, _ = sf.read(speech.path("meeting.wav"), dtype="float32")
    windows, expected = reference()
    start, end = windows[0]
    flat, frames, offsets, _ = extract(samples, [(start + 0.01, end + 0.01)])
    assert np.abs(per_window(flat, frames, offsets)[0] - expected[0]).max() > 10 * TOLERANCE


@pytest.mark.skipif(
    bool(NO_AVX512), reason=f"senko's native library needs AVX-512; this CPU lacks {NO_AVX512}"
)
def test_senkos_native_library_matches_the_reference_too(tmp_path: Path) -> None:
    """On a CPU with AVX-512: senko's shipped library computes the committed reference (in a
    child process, so a wrong flag reading costs a failure, not pytest)."""
    out = tmp_path / "native.npz"
    run = subprocess.run(
        [sys.executable, "scripts/fbank_reference.py", "--out", str(out)],
        capture_output=True,
        cwd=Path(__file__).parents[1],
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    native = np.load(out)
    for i, want in enumerate(reference()[1]):
        assert np.abs(native[f"window_{i}"] - want).max() <= TOLERANCE


@pytest.mark.parametrize(
    ("setting", "flags", "chosen"),
    [
        ("auto", set(), "portable"),  # the flags read as absent (not Linux, not x86)
        ("auto", {"avx2", "fma"}, "portable"),  # AMD Rome/Milan
        ("auto", NATIVE_NEEDS - {"avx512bw"}, "portable"),  # Xeon Phi: F without BW
        ("auto", NATIVE_NEEDS | {"avx2"}, "native"),
        ("portable", NATIVE_NEEDS, "portable"),  # forced: tested on every machine
        ("native", set(), "native"),  # forced, at the user's risk (a 503 per request)
    ],
)
def test_the_cpu_flags_choose_the_path(setting: str, flags: set[str], chosen: str) -> None:
    assert choose_features(setting, flags) == chosen


def test_an_unknown_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="DIARIZE_FEATURES"):
        choose_features("fast", set())


def test_cpu_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\n")
    assert cpu_flags(cpuinfo) == {"fpu", "avx2", "fma"}
    assert missing_for_native(cpu_flags(cpuinfo)) == sorted(NATIVE_NEEDS)
    assert cpu_flags(tmp_path / "absent") == frozenset()
    cpuinfo.write_text("processor\t: 0\nFeatures\t: fp asimd\n")  # ARM: no flags line
    assert cpu_flags(cpuinfo) == frozenset()


def test_windows_are_cut_as_senko_cuts_them() -> None:
    assert window_bounds(1.0, 2.5, 100_000) == (16000, 24000)
    assert window_bounds(6.0, 7.0, 100_000) == (96000, 4000)  # runs past the end: clipped
    assert window_bounds(2.0, 2.0, 100_000) == (32000, 1)  # empty: one sample, then padded
    assert window_bounds(1.0, 2.0, 100_000, offset=16000) == (0, 16000)


def test_no_windows_give_no_features() -> None:
    flat, frames, offsets, dim = extract(np.zeros(16000, np.float32), [])
    assert (flat.size, frames.size, offsets.size, dim) == (0, 0, 0, 80)
