"""POST /v1/realtime/client_secrets (the openai SDK's `client.realtime.client_secrets
.create`): mint a short-lived key (`ek_…`) that opens the /v1/realtime WebSocket only, until
it expires, so a browser can connect without holding API_KEY. Minting needs the real key
(a client secret cannot mint more). Only transcription sessions are served here.

The request's session config is checked as a session.update's would be and echoed in the
answer (fields this server does not read are left out); it is kept with the secret
(`secret_store.ClientSecret.session`)."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends
from pydantic import BaseModel, ConfigDict, Field

from ...errors import BadRequestError
from ..deps import AppContext, get_ctx, require_api_key
from ..live.common import base_config
from ..live.messages import MessageError, SessionConfig, check_strings, validate
from .realtime_session import RealtimeState

router = APIRouter(dependencies=[Depends(require_api_key)])
PATH = "/v1/realtime/client_secrets"

SESSION_FIELDS = ("type", "audio", "include")


class ExpiresAfter(BaseModel):
    """When the secret expires: `seconds` after its creation (OpenAI's range and default)."""

    model_config = ConfigDict(extra="forbid")
    anchor: Literal["created_at"] = "created_at"
    seconds: int = Field(default=600, ge=10, le=7200)


class ClientSecretRequest(BaseModel):
    """OpenAI's ClientSecretCreateParams."""

    model_config = ConfigDict(extra="forbid")
    expires_after: ExpiresAfter = Field(default_factory=lambda: ExpiresAfter())
    session: dict[str, Any] | None = None


def transcription_session(ctx: AppContext, given: dict[str, Any] | None) -> dict[str, Any]:
    """The request's session config, checked: a transcription session (`type` may be left
    out) with `audio` and `include` as a session.update's, checked as one is (the decoding
    fields too: the model's languages, keywords, no null transcription), so that a session
    opened with the secret never fails on them. Raises BadRequestError naming the
    parameter."""
    given = given or {}
    try:
        check_strings(given)  # before anything echoes what the client sent
    except MessageError as exc:
        param = f"session.{exc.param}" if exc.param else "session"
        raise BadRequestError(f"session.{exc.message}", param=param, code=exc.code) from None
    kind = given.get("type", "transcription")
    if kind != "transcription":
        raise BadRequestError(
            f"session.type {kind!r} is not served: this server runs transcription sessions "
            'only (session.type "transcription").',
            param="session.type",
            code="invalid_value",
        )
    for name in given:
        if name not in SESSION_FIELDS:
            raise BadRequestError(
                f"session.{name}: not a field of a transcription session "
                f"(it has {', '.join(SESSION_FIELDS)}).",
                param=f"session.{name}",
                code="unknown_parameter",
            )
    include = given.get("include")
    if include is not None and (
        not isinstance(include, list)
        or any(i != "item.input_audio_transcription.logprobs" for i in include)
    ):
        raise BadRequestError(
            'session.include: a list of "item.input_audio_transcription.logprobs".',
            param="session.include",
            code="invalid_value",
        )
    session: dict[str, Any] = {"type": "transcription"}
    try:
        config = validate(SessionConfig, {"audio": given.get("audio"), "include": include})
    except MessageError as exc:
        param = f"session.{exc.param}" if exc.param else "session"
        raise BadRequestError(f"session.{exc.message}", param=param, code=exc.code) from None
    audio = config.model_dump(mode="json", exclude_unset=True).get("audio")
    if audio is not None:
        session["audio"] = audio
    try:  # what a session.update with this config would do (the decoding checked too)
        RealtimeState("mint", base_config(ctx, False), 0.0).apply(ctx, config)
    except MessageError as exc:
        raise BadRequestError(exc.message, param=exc.param, code=exc.code) from None
    if include:
        session["include"] = list(dict.fromkeys(include))
    return session


@router.post(PATH)
async def create_client_secret(
    ctx: Annotated[AppContext, Depends(get_ctx)],
    request: Annotated[ClientSecretRequest | None, Body()] = None,
) -> dict[str, Any]:
    """A client secret for /v1/realtime (OpenAI's ClientSecretCreateResponse)."""
    request = request or ClientSecretRequest()
    session = transcription_session(ctx, request.session)
    value, granted = ctx.client_secrets.mint(request.expires_after.seconds, session)
    described = {
        "id": "sess_" + uuid.uuid4().hex[:20],
        "object": "realtime.transcription_session",
        **session,
    }
    return {"value": value, "expires_at": granted.expires_at, "session": described}
