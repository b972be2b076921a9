"""Engine selection. Constructing an engine imports nothing heavy; `load()` does."""

from __future__ import annotations

from typing import Any

from ..config import Settings
from ..models.choice import DEFAULT_CPU_MODEL, DEFAULT_CUDA_MODEL, detect_engine, served_model_id
from .base import Engine, TranscribeRequest, TranscribeResult
from .spec import EngineSpec
from .status import EngineStatus

__all__ = [
    "Engine",
    "EngineStatus",
    "TranscribeRequest",
    "TranscribeResult",
    "create_engine",
    "engine_spec",
]


def create_engine(settings: Settings, inline: bool = False) -> Engine:
    """The engine the settings describe; in worker mode (unless `inline`, which the worker
    itself passes) a proxy that runs it in a child process. With DUAL_MODEL, a pair whose
    fast model (FAST_MODEL_ID, any engine) takes the streaming partials."""
    engine = _create_one(settings, inline)
    if not settings.dual_model or inline:
        return engine
    from .dual import DualEngine

    fast = settings.model_copy(
        update={
            "model_id": settings.fast_model_id,
            "engine": "auto",
            "dual_model": False,
            "forced_aligner_id": None,  # word times come from the main model
        }
    )
    return DualEngine(engine, _create_one(fast, inline, "FAST_MODEL_ID"))


def _create_one(settings: Settings, inline: bool, setting: str = "MODEL_ID") -> Engine:
    if settings.engine == "remote":
        from .remote.engine import RemoteEngine

        return RemoteEngine(
            settings.remote_urls,
            model=settings.remote_model,
            api_key=settings.remote_api_key,
            max_inflight=settings.remote_max_inflight,
            request_timeout=settings.request_timeout,
            connect_timeout=settings.remote_connect_timeout,
            probe_interval=settings.remote_probe_interval,
            call_timeout=settings.remote_call_timeout,
        )
    spec = engine_spec(settings, setting)
    if settings.use_worker and not inline:
        from .worker import WorkerEngine

        return WorkerEngine(
            spec.build(),
            spec,
            hard_timeout=settings.request_timeout + settings.worker_kill_grace,
            kill_grace=settings.worker_kill_grace,
            log=(settings.log_level, settings.log_json),
        )
    return spec.build()


def engine_spec(settings: Settings, setting: str = "MODEL_ID") -> EngineSpec:
    """The local engine the settings describe, as a picklable spec; `setting` names it in
    load errors (FAST_MODEL_ID for DUAL_MODEL's fast model)."""
    model_id = served_model_id(settings)
    kind = settings.engine if settings.engine != "auto" else detect_engine(model_id)
    if kind == "whisper":
        options: dict[str, Any] = {
            "device": settings.device,
            "cpu_threads": settings.cpu_threads,
            "beam_size": settings.whisper_beam_size,
            "setting": setting,
        }
        return EngineSpec("whisper", model_id, options)
    options = {
        "device": settings.device,
        "dtype": settings.dtype,
        "max_new_tokens": settings.max_new_tokens,
        "cpu_threads": settings.cpu_threads,
        "aligner_id": settings.forced_aligner_id,
        "attention": settings.attn_implementation,
        # MODEL_ID unset: the driver's presence is only a guess; the engine picks the model
        # for the device torch really sees when it loads.
        "defaults": None if settings.model_id else (DEFAULT_CPU_MODEL, DEFAULT_CUDA_MODEL),
        "quantize": settings.quantize,
        "setting": setting,
        "decode": settings.qwen_decode,
        "rows": settings.max_batch_size,
        "kv_tokens": settings.kv_cache_tokens,
        "graphs": settings.cuda_graphs,
    }
    return EngineSpec("qwen", model_id, options)
