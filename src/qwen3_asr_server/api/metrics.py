"""GET /metrics: Prometheus exposition. Needs the API key when one is set (Prometheus
sends it as a bearer token: `authorization: {credentials: ...}` in its scrape config)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from .deps import AppContext, get_ctx, require_api_key

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.get("/metrics", include_in_schema=False)
async def metrics(ctx: AppContext = Depends(get_ctx)) -> Response:
    return Response(ctx.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
