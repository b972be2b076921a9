"""Run every benchmark in turn: `make bench`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = ["core.py", "whisper.py", "batching.py", "long_audio.py", "streaming.py"]

if __name__ == "__main__":
    for script in SCRIPTS:
        print(f"\n== {script} ==", flush=True)
        subprocess.run([sys.executable, str(HERE / script)], check=True)
