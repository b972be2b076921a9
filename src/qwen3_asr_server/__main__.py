"""`python -m qwen3_asr_server`: the command line (`cli/main.py`); bare, it serves."""

from __future__ import annotations

from .cli.main import main

if __name__ == "__main__":
    main()
