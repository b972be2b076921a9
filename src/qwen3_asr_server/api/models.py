"""GET /v1/models: the served model plus `whisper-1` as an alias, in OpenAI's list shape
(with `fallback: {wanted, reason}` when the bundled model serves instead of the default)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from ..errors import NotFoundError
from .deps import AppContext, get_ctx, require_api_key

router = APIRouter(dependencies=[Depends(require_api_key)])
ALIAS = "whisper-1"


def _models(ctx: AppContext) -> list[dict[str, Any]]:
    created = int(ctx.started_wall)
    served = ctx.manager.engine.model_id
    owner = f"qwen3-asr-server ({ctx.manager.engine.name})"
    ids = [served] + ([ALIAS] if served != ALIAS else [])
    models = [{"id": i, "object": "model", "created": created, "owned_by": owner} for i in ids]
    if ctx.manager.fallback is not None:  # served instead of the default: say so
        for model in models:
            model["fallback"] = ctx.manager.fallback.body()
    return models


@router.get("/v1/models")
async def list_models(ctx: AppContext = Depends(get_ctx)) -> dict[str, Any]:
    return {"object": "list", "data": _models(ctx)}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, ctx: AppContext = Depends(get_ctx)) -> dict[str, Any]:
    for model in _models(ctx):
        if model["id"] == model_id:
            return model
    raise NotFoundError(f"The model {model_id!r} does not exist.", param="model")
