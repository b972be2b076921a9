"""The app factory: Settings -> engine -> ModelManager -> scheduler -> services -> routers."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from loguru import logger
from starlette.routing import WebSocketRoute

from . import __version__
from .api import health, models
from .api import metrics as metrics_route
from .api.deepgram import live as deepgram_live
from .api.deepgram import prerecorded as deepgram_file
from .api.deepgram.fetch import Fetches, host_patterns
from .api.deps import AppContext
from .api.error_handlers import install_error_handlers
from .api.middleware import (
    ApiKeyMiddleware,
    BodyLimitMiddleware,
    MetricsMiddleware,
    RequestContextMiddleware,
)
from .api.openai import client_secrets, realtime, subtitles, transcriptions, translations
from .api.openapi import install_openapi
from .api.secret_store import ClientSecretStore
from .api.seed import transcribe as ws_transcribe
from .api.ui import install_ui
from .audio.budget import AudioBudget
from .audio.segmentation import Segmenter
from .audio.vad import SileroModel
from .config import Settings
from .engines import Engine, create_engine
from .engines.speakers.diarizing import with_diarizer
from .engines.speakers.process import DiarizerSpec
from .logging import setup_logging
from .models.plan import ModelPlan, plan_model, precheck
from .outputs.translate import Translator
from .runtime.lifecycle import ModelManager
from .runtime.metrics import Metrics
from .runtime.scheduler import PriorityScheduler
from .runtime.voices import Voices
from .streaming.registry import SessionRegistry
from .transcription.service import Transcriber

MULTIPART_SLACK = 1_000_000  # form fields and multipart framing around the file


def create_app(settings: Settings | None = None, engine: Engine | None = None) -> FastAPI:
    """Build a fresh app. `engine` overrides the one chosen from settings (tests)."""
    settings = settings or Settings()
    setup_logging(settings.log_level, settings.log_json)
    for note in settings.notes():  # seed settings that were overridden or have no effect
        logger.warning(note)
    # the model to serve (the default may fall back, loudly) and what to fetch first
    plan = plan_model(settings) if engine is None else ModelPlan(settings)
    # the served engine, with a speaker diarizer that loads on first use (or with the model:
    # PRELOAD and DIARIZE_PRELOAD) and unloads with it
    chosen = with_diarizer(
        engine or create_engine(plan.settings),
        DiarizerSpec(
            settings.diarize_features, settings.cpu_threads, (settings.log_level, settings.log_json)
        ),
        timeout=settings.request_timeout,
        with_model=settings.preload and settings.diarize_preload,
    )
    metrics = Metrics()
    # live speakers: a child of their own (one torch thread), apart from the uploads' diarizer
    voices_spec = DiarizerSpec(
        settings.diarize_features, 1, (settings.log_level, settings.log_json), voices=True
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        scheduler = PriorityScheduler(
            settings.max_queue,
            max_batch=settings.max_batch_size,
            on_start=metrics.observe_job,
            on_batch=metrics.observe_batch,
            # remote backends (also DUAL_MODEL's main engine): their total capacity
            workers=chosen.capacity,
        )
        scheduler.start()
        manager = ModelManager(
            chosen,
            idle_timeout=settings.idle_timeout,
            busy=lambda: scheduler.busy,
            load_timeout=settings.request_timeout,  # a request waits this long for a load
            download=plan.background(),  # hub models missing from the cache, fetched first
            fallback=plan.fallback,
            # a front (ENGINE=remote) holds no model: nothing of its own to find or fetch
            precheck=precheck if engine is None and settings.engine != "remote" else None,
        )
        vad = SileroModel()
        sessions = SessionRegistry(settings.ws_max_sessions)
        budget = AudioBudget(settings.max_pending_audio_seconds)
        voices = Voices(voices_spec, idle_timeout=settings.idle_timeout)
        app.state.ctx = AppContext(
            settings=settings,
            manager=manager,
            scheduler=scheduler,
            transcriber=Transcriber(
                settings,
                manager,
                scheduler,
                Segmenter(settings.segment_max_seconds, vad if settings.segment_vad else None),
                metrics,
            ),
            translator=Translator(settings),
            vad=vad,
            sessions=sessions,
            metrics=metrics,
            budget=budget,
            started_at=time.monotonic(),
            started_wall=time.time(),
            client_secrets=ClientSecretStore(),
            voices=voices,
            fetches=Fetches(host_patterns(settings.listen_url_hosts)),
        )

        # every live route has its series in /metrics, at 0 while none of its streams is open
        live = (ws_transcribe.router, realtime.router, deepgram_live.router)
        idle_routes = {
            r.path: (0, 0)
            for router in live
            for r in router.routes
            if isinstance(r, WebSocketRoute)
        }

        def state() -> dict[str, Any]:
            status = chosen.status()
            max_lag, pending_finals = sessions.lag()
            return {
                "model_loaded": manager.loaded,
                "load_seconds": manager.last_load_seconds,
                "queue_depth": scheduler.depth,
                "stream_routes": {**idle_routes, **sessions.by_route()},
                "stream_max_lag": max_lag,
                "stream_pending_final_seconds": pending_finals,
                "vad": vad.batcher.stats(),
                "backend_slot_wait": status.backend_slot_wait,
                "backend_latency": status.backend_latency,
                "pending_audio_seconds": budget.in_use,
                "pending_audio_limit_seconds": budget.limit,
                "audio_budget_refusals": budget.refused,
                "loads": manager.loads,
                "unloads": manager.unloads,
                "worker_restarts": status.restarts,
                "backends": list(status.backends),
                "download": manager.download.status() if manager.download else None,
                "fallback": manager.fallback is not None,
            }

        metrics.watch(state)
        gc.callbacks.append(metrics.gc_callback)
        try:
            await voices.start()
            await manager.start(preload=settings.preload)  # after the download, if any
            logger.info("serving {} ({} engine) on {}", chosen.model_id, chosen.name, chosen.device)
            yield
        finally:
            try:
                # open utterances get their finals first (at most SHUTDOWN_TIMEOUT seconds)
                await sessions.close_all(settings.shutdown_timeout)
                await asyncio.to_thread(scheduler.stop)
                await manager.stop()
                await voices.stop()
                vad.close()
            finally:  # the callback must not outlive the app, whatever failed above
                gc.callbacks.remove(metrics.gc_callback)

    app = FastAPI(title="qwen3-asr-server", version=__version__, lifespan=lifespan)
    install_error_handlers(app)
    install_openapi(app)
    # The last added runs first: request id, CORS, metrics, API key, body limit, routes.
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=settings.max_upload_bytes + MULTIPART_SLACK,
        limit_mb=settings.max_upload_mb,
        json_paths=(client_secrets.PATH,),  # a session config: no bigger than a WS message
        json_max_bytes=settings.ws_max_frame_bytes,
    )
    app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key)  # before the body is read
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    if settings.cors_origins:  # before the key check: a preflight carries no key
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],  # the requested ones are echoed, Authorization included
            expose_headers=["X-Request-ID", "Retry-After", "X-Model-ID"],
        )
    app.add_middleware(RequestContextMiddleware)
    app.include_router(health.router)
    app.include_router(models.router)
    app.include_router(transcriptions.router)
    app.include_router(subtitles.router)
    app.include_router(translations.router)
    app.include_router(ws_transcribe.router)
    app.include_router(realtime.router)
    app.include_router(deepgram_live.router)
    app.include_router(deepgram_file.router)
    app.include_router(client_secrets.router)
    app.include_router(metrics_route.router)
    install_ui(app)
    return app
