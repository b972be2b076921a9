"""The command line: `qwen3-asr-server [serve | download | check] [--setting VALUE ...]`.

Every `Settings` field is a flag (`--max-queue 32` for MAX_QUEUE), generated from the class
with its env name, default and docstring, so the two never drift apart. Flags override the
environment and `.env`. A bare `qwen3-asr-server` serves. Bad flags and bad values print
one line each and exit 2, before anything starts.
"""

from __future__ import annotations

import argparse
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from .. import __version__
from ..config import Settings
from ..errors import ModelLoadError

FLAG_ALIASES = {"model_id": ["--model"]}  # the short names users of `vllm serve` expect
USAGE = (
    "%(prog)s [serve | download [MODEL ...] [--to DIR] | check | transcribe FILE|DIR ...] "
    "[--SETTING VALUE ...]"
)
COMMANDS = {
    "serve": "start the server (the default)",
    "download": "fetch models into the HF cache (or a plain directory with --to); no MODEL: "
    "the configured or default model",
    "check": "which model would be served and why, and can this machine serve it? (exit 1 "
    "with a fix per problem)",
    "transcribe": "transcribe files to txt/srt/vtt/json in this process, or with --server URL "
    "through a running server",
}


def env_value(value: Any) -> str:
    """A value as it is written in an env file (.env.example, the CLI's --help)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def choices(annotation: Any) -> list[str]:
    """The allowed values of a Literal field (also inside `X | None`)."""
    if typing.get_origin(annotation) is Literal:
        return [env_value(a) for a in typing.get_args(annotation)]
    for arg in typing.get_args(annotation):
        found = choices(arg)
        if found:
            return found
    return []


def add_settings_flags(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    group = parser.add_argument_group(
        "settings", "Each flag overrides its environment variable and .env (see .env.example)."
    )
    for name, field in Settings.model_fields.items():
        if name in skip:
            continue
        doc = (field.description or "").split("\n\n")[0].replace("\n", " ").replace("%", "%%")
        first = doc.split(". ")[0].rstrip(".")
        help_text = f"{first}. [{name.upper()}; default: {env_value(field.default) or 'unset'}]"
        flags = ["--" + name.replace("_", "-"), *FLAG_ALIASES.get(name, [])]
        if field.annotation is bool:
            group.add_argument(
                *flags,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
            continue
        allowed = choices(field.annotation)
        group.add_argument(
            *flags,
            dest=name,
            default=argparse.SUPPRESS,
            metavar="{" + ",".join(allowed) + "}" if allowed else name.upper(),
            help=help_text,
        )


def build_parser() -> argparse.ArgumentParser:
    settings = argparse.ArgumentParser(add_help=False)
    add_settings_flags(settings)
    parser = argparse.ArgumentParser(
        prog="qwen3-asr-server",
        usage=USAGE,
        description="Self-hosted, OpenAI-compatible speech-to-text server for Qwen3-ASR.",
        epilog="Commands: "
        + "; ".join(f"{name}: {doc}" for name, doc in COMMANDS.items())
        + ". `qwen3-asr-server COMMAND --help` for each.",
        parents=[settings],
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="{serve,download,check,transcribe}")
    each = "%(prog)s [--SETTING VALUE ...]"
    commands.add_parser("serve", help=COMMANDS["serve"], parents=[settings], usage=each)
    download = commands.add_parser(
        "download",
        help=COMMANDS["download"],
        parents=[settings],
        usage="%(prog)s [MODEL ...] [--to DIR] [--SETTING VALUE ...]",
    )
    download.add_argument(
        "models",
        nargs="*",
        metavar="MODEL",
        help="HF repo ids (default: MODEL_ID, and FORCED_ALIGNER_ID / FAST_MODEL_ID when used)",
    )
    download.add_argument(
        "--to",
        type=Path,
        metavar="DIR",
        help="write a plain directory that MODEL_ID=DIR serves (one model: DIR itself; "
        "several: one folder each inside DIR), to carry to an offline machine",
    )
    commands.add_parser("check", help=COMMANDS["check"], parents=[settings], usage=each)
    from .transcribe import add_arguments

    client_settings = argparse.ArgumentParser(add_help=False)
    add_settings_flags(client_settings, skip=("api_key",))  # --api-key is the server's key
    transcribe = commands.add_parser(
        "transcribe",
        help=COMMANDS["transcribe"],
        parents=[client_settings],
        usage="%(prog)s FILE|DIR ... [--format txt|srt|vtt|json|verbose_json] [--out DIR] "
        "[--language X] [--server URL] [--api-key K] [--jobs N] [--overwrite] "
        "[--SETTING VALUE ...]",
    )
    add_arguments(transcribe)
    return parser


def load_settings(overrides: dict[str, Any]) -> Settings:
    """Settings from flags > environment > .env; a bad value exits 2 with one line each."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:  # say which and how, no traceback
        for error in exc.errors():
            name = "_".join(str(part) for part in error["loc"]).upper()
            where = f"{name}: " if name else ""
            message = error["msg"].removeprefix("Value error, ")
            print(f"qwen3-asr-server: {where}{message}", file=sys.stderr)
        sys.exit(2)


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)  # unknown flags: usage, exit 2
    overrides = {k: v for k, v in vars(args).items() if k in Settings.model_fields}
    settings = load_settings(overrides)
    if args.command == "download":
        from .download import download

        sys.exit(download(settings, args.models, args.to))
    if args.command == "check":
        from .check import check

        sys.exit(check(settings))
    try:
        if args.command == "transcribe":
            from .transcribe import transcribe

            sys.exit(transcribe(settings, args))
        from .serve import serve

        serve(settings)
    except ModelLoadError as exc:  # a model that cannot be served at all, e.g. MODEL_ID a
        # directory that holds no model: one line, as for the other bad settings
        print(f"qwen3-asr-server: {exc}", file=sys.stderr)
        sys.exit(2)
