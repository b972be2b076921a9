"""Write tests/data/fbank_reference.npz: senko's own filterbank features of a few stretches of
tests/data/speech/meeting.wav, the reference the portable path is tested against
(tests/test_fbank.py).

    .venv/bin/python scripts/fbank_reference.py [--lib PATH] [--out PATH]

`--lib` is a library with senko 0.2.2's C API (`extract_fbank_features_from_memory`); the
default is the one senko ships, which runs only on a CPU with AVX-512 (elsewhere this script
dies with SIGILL). The committed file was made on an AVX2-only CPU from senko's own C++
source (github.com/narcotic-sh/senko, senko/fbank_extractor), built with its flags but
`-mavx2 -mfma` in place of `-march=native`, behind the same C API.
"""

from __future__ import annotations

import argparse
import ctypes
from pathlib import Path

import numpy as np
import soundfile as sf

ROOT = Path(__file__).resolve().parents[1]
CLIP = ROOT / "tests" / "data" / "speech" / "meeting.wav"
OUT = ROOT / "tests" / "data" / "fbank_reference.npz"

# (start, end) in seconds: senko's 1.5 s windows at offsets off the 10 ms grid, a shorter
# last window, one under 400 samples (padded), and one that runs past the end of the clip
WINDOWS = [(0.3712, 1.8712), (7.205, 8.705), (20.0031, 21.0), (33.3, 33.6), (40.0, 40.0249)]


class FbankFeatures(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.POINTER(ctypes.c_float)),
        ("frames_per_subsegment", ctypes.POINTER(ctypes.c_size_t)),
        ("subsegment_offsets", ctypes.POINTER(ctypes.c_size_t)),
        ("num_subsegments", ctypes.c_size_t),
        ("total_frames", ctypes.c_size_t),
        ("feature_dim", ctypes.c_size_t),
    ]


def windows(duration: float) -> list[tuple[float, float]]:
    return [*WINDOWS, (duration - 1.5, duration + 0.5)]


def native(
    lib_path: str, samples: np.ndarray, subsegments: list[tuple[float, float]]
) -> list[np.ndarray]:
    lib = ctypes.CDLL(lib_path)
    lib.create_fbank_extractor.restype = ctypes.c_void_p
    lib.extract_fbank_features_from_memory.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_float),
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_float),
        ctypes.c_size_t,
    ]
    lib.extract_fbank_features_from_memory.restype = FbankFeatures
    lib.free_fbank_features.argtypes = [ctypes.POINTER(FbankFeatures)]
    extractor = lib.create_fbank_extractor()
    flat_subs = np.array(subsegments, dtype=np.float32).reshape(-1)
    samples = np.ascontiguousarray(samples, dtype=np.float32)
    pointer = ctypes.POINTER(ctypes.c_float)
    result = lib.extract_fbank_features_from_memory(
        extractor,
        samples.ctypes.data_as(pointer),
        len(samples),
        flat_subs.ctypes.data_as(pointer),
        len(subsegments),
    )
    count = result.num_subsegments
    flat = np.ctypeslib.as_array(result.data, (result.total_frames * result.feature_dim,)).copy()
    frames = np.ctypeslib.as_array(result.frames_per_subsegment, (count,)).copy()
    offsets = np.ctypeslib.as_array(result.subsegment_offsets, (count,)).copy()
    lib.free_fbank_features(ctypes.byref(result))
    return [
        flat[o : o + n * result.feature_dim].reshape(n, result.feature_dim)
        for n, o in zip(frames, offsets, strict=True)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", help="a library with senko's C API (default: senko's own)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.lib is None:
        from senko import config

        args.lib = config.get_fbank_lib_path()
    samples, rate = sf.read(CLIP, dtype="float32")
    assert rate == 16000
    subsegments = windows(len(samples) / rate)
    features = native(args.lib, samples, subsegments)
    arrays = {f"window_{i}": f for i, f in enumerate(features)}
    np.savez_compressed(args.out, windows=np.array(subsegments, dtype=np.float64), **arrays)
    sizes = [f.shape[0] for f in features]
    print(f"{args.out}: {len(features)} windows, frames {sizes}")


if __name__ == "__main__":
    main()
