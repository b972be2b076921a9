"""GET /health: never loads the model, never imports torch."""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any

from fastapi import APIRouter, Depends

from ..engines import EngineStatus
from .deps import AppContext, get_ctx

router = APIRouter()


def _cuda_info() -> dict[str, Any]:
    """GPU facts, only when torch is already imported (never import it here)."""
    torch: Any = sys.modules.get("torch")
    if torch is None or getattr(getattr(torch, "__spec__", None), "_initializing", False):
        return {"cuda": None}  # not imported, or being imported by a load: never wait on it
    try:
        if not torch.cuda.is_available():
            return {"cuda": False}
        return {
            "cuda": True,
            "gpu": torch.cuda.get_device_name(0),
            "gpu_memory_allocated_mb": round(torch.cuda.memory_allocated(0) / 2**20, 1),
            "gpu_memory_reserved_mb": round(torch.cuda.memory_reserved(0) / 2**20, 1),
        }
    except Exception:  # a broken CUDA setup must not break /health
        return {"cuda": False}


def _worker_info(status: EngineStatus) -> dict[str, Any]:
    """ENGINE_PROCESS=worker: the child's pid, state and restarts."""
    if status.worker is None:
        return {}
    worker = status.worker
    return {"worker": {"pid": worker.pid, "state": worker.state, "restarts": worker.restarts}}


def _diarizer_info(status: EngineStatus) -> dict[str, Any]:
    """The speaker diarizer's child process: pid, state, restarts, filterbank path."""
    if status.diarizer is None:
        return {}
    return {"diarizer": dataclasses.asdict(status.diarizer)}


def _fast_info(status: EngineStatus, loaded: bool) -> dict[str, Any]:
    """DUAL_MODEL: the partials' model (loaded and unloaded with the main one)."""
    fast = status.fast
    if fast is None:
        return {}
    return {
        "fast_model": {
            "model_id": fast.model_id,
            "engine": fast.name,
            "device": fast.device,
            "loaded": loaded,
            **_worker_info(fast),
        }
    }


def _backend_info(status: EngineStatus) -> dict[str, Any]:
    """ENGINE=remote: each backend's state, jobs in flight, latency and errors."""
    if not status.backends:
        return {}
    return {
        "backends": list(status.backends),
        "backends_up": sum(b["state"] == "up" for b in status.backends),
        # jobs that wait for a slot: the backends that are up are full, the others down
        "backend_waiting": status.backend_waiting,
    }


@router.get("/health")
async def health(ctx: AppContext = Depends(get_ctx)) -> dict[str, Any]:
    engine = ctx.manager.engine
    status = engine.status()  # DUAL_MODEL: the main model's facts, the fast one's inside
    return {
        "status": "ok",
        "model_loaded": ctx.manager.loaded,
        "model_state": ctx.manager.state,
        "model_id": engine.model_id,
        "engine": engine.name,
        "device": engine.device,
        "dtype": status.dtype,  # in use, once loaded (Qwen)
        "attention": status.attention,
        **_worker_info(status),
        **_fast_info(status, ctx.manager.loaded),
        **_backend_info(status),
        **_diarizer_info(status),
        # live speakers' child (one for every stream): why finals went out without a speaker
        "live_speakers": dataclasses.asdict(ctx.voices.status()),
        "queue_depth": ctx.scheduler.depth,
        "busy": ctx.scheduler.busy,
        "streaming_sessions": len(ctx.sessions),
        "pending_audio_seconds": round(ctx.budget.in_use, 1),
        "max_pending_audio_seconds": ctx.budget.limit,
        "uptime_s": round(time.monotonic() - ctx.started_at, 3),
        "last_load_error": ctx.manager.last_error,
        "load_retry_in_s": round(ctx.manager.retry_in(), 1),
        # a hub model being fetched before its first load: bytes, ETA, the last error
        "download": ctx.manager.download.status() if ctx.manager.download else None,
        # the bundled model serves instead of the default one (announced at start)
        "fallback": ctx.manager.fallback.body() if ctx.manager.fallback else None,
        **_cuda_info(),
    }
