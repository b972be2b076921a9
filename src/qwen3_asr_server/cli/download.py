"""`qwen3-asr-server download`: models into the HF cache, or a plain directory to carry to an
offline machine, with a clear answer when offline."""

from __future__ import annotations

from pathlib import Path

from ..config import Settings
from ..models.cache import LOCAL, NOT_CACHED, copy_model, fetch, size_mb
from ..models.choice import models_for, served_model_id, setting_for


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
