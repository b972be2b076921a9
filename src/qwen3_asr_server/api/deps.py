"""Shared request dependencies: the app context and bearer auth."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from fastapi import Request

from ..audio.budget import AudioBudget
from ..audio.vad import SileroModel
from ..config import Settings
from ..errors import AuthError
from ..outputs.translate import Translator
from ..runtime.lifecycle import ModelManager
from ..runtime.metrics import Metrics
from ..runtime.scheduler import PriorityScheduler
from ..runtime.voices import Voices
from ..streaming.registry import SessionRegistry
from ..transcription.service import Transcriber
from .deepgram.fetch import Fetches
from .secret_store import PREFIX, ClientSecretStore


@dataclass
class AppContext:
    """Everything the routers need, built once in the app's lifespan."""

    settings: Settings
    manager: ModelManager
    scheduler: PriorityScheduler
    transcriber: Transcriber
    translator: Translator
    vad: SileroModel
    sessions: SessionRegistry
    metrics: Metrics
    budget: AudioBudget  # decoded audio held by uploads
    started_at: float  # time.monotonic() at start
    started_wall: float  # time.time() at start
    client_secrets: ClientSecretStore  # ek_ keys for /v1/realtime (api/client_secrets.py)
    voices: Voices  # live speakers' fingerprints, one child for every stream (runtime/voices.py)
    fetches: Fetches  # POST /v1/listen's URL bodies: LISTEN_URL_HOSTS, slots (deepgram/fetch.py)


def get_ctx(request: Request) -> AppContext:
    ctx: AppContext = request.app.state.ctx
    return ctx


def check_api_key(expected: str | None, authorization: str | None) -> None:
    """Raise AuthError unless `authorization` is `Bearer <expected>` (or no key is set). A
    client secret (`ek_…`) is never the key: it opens the /v1/realtime WebSocket only."""
    if not expected:
        return
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise AuthError("Missing API key. Send 'Authorization: Bearer <API_KEY>'.")
    if not hmac.compare_digest(token.strip().encode(), expected.encode()):
        if token.strip().startswith(PREFIX):
            raise AuthError(
                "A client secret (ek_...) opens the /v1/realtime WebSocket only; "
                "send the API key here."
            )
        raise AuthError("Incorrect API key provided.")


async def require_api_key(request: Request) -> None:
    check_api_key(request.app.state.ctx.settings.api_key, request.headers.get("authorization"))
