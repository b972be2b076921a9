"""Write `.env.example` from `qwen3_asr_server.config.Settings`: every field as its env var,
with its default and its docstring. Run it after adding or changing a setting:

    .venv/bin/python scripts/make_env_example.py          # rewrite .env.example
    .venv/bin/python scripts/make_env_example.py --check  # exit 1 if it is out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from qwen3_asr_server.cli.main import choices, env_value  # noqa: E402
from qwen3_asr_server.config import Settings  # noqa: E402

TARGET = ROOT / ".env.example"

HEADER = """\
# qwen3-asr-server settings. Copy this file to .env and uncomment what you change; each
# commented line shows the default. The server reads .env from its working directory and
# docker compose passes it to the container (env_file). Names are case-insensitive.
# With docker compose, HOST and PORT inside the container are fixed (0.0.0.0:8000); PORT
# here is also the host port compose publishes (default 8100).
#
# Generated from qwen3_asr_server.config.Settings by scripts/make_env_example.py: edit the
# docstrings in config.py and re-run the script, not this file.
"""


def field_docs(cls: type[Settings] = Settings) -> dict[str, str]:
    """Each field's docstring (Settings keeps them as descriptions)."""
    return {name: field.description or "" for name, field in cls.model_fields.items()}


def render() -> str:
    docs = field_docs()
    out = [HEADER.rstrip("\n")]
    for name, field in Settings.model_fields.items():
        doc = docs.get(name, "").split("\n")
        allowed = choices(field.annotation)
        if allowed:
            doc.append(f"One of: {', '.join(allowed)}.")
        out.append("")
        out.extend(("# " + line).rstrip() for line in doc if line or len(doc) > 1)
        out.append(f"# {name.upper()}={env_value(field.default)}")
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if .env.example differs")
    args = parser.parse_args()
    text = render()
    if args.check:
        if TARGET.read_text() != text:
            print(f"{TARGET.name} is out of date: run python scripts/make_env_example.py")
            return 1
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET} ({len(Settings.model_fields)} settings)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
