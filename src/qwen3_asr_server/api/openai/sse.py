"""Server-sent events: framing, and a stream that reports errors in OpenAI's shape."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse
from loguru import logger

from ...errors import ServiceError
from ..error_table import error_body, http_status, openai_body

DONE = b"data: [DONE]\n\n"


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


async def guarded(events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """Frame each event; an error mid-stream becomes `data: {"error": {...}}` and ends it.

    Sending waits for the client (uvicorn applies back-pressure), so a slow reader pauses
    the producer instead of growing a buffer. If the client disconnects, Starlette cancels
    this generator and the producer's pending job is cancelled with it.
    """
    try:
        async for payload in events:
            yield event(payload)
    except ServiceError as exc:
        logger.warning("stream failed: {} {}", http_status(exc), exc.message)
        yield event(openai_body(exc))
        return
    except Exception as exc:
        logger.opt(exception=exc).error("stream failed")
        yield event(error_body("Internal server error.", "server_error", None, "internal_error"))
        return
    yield DONE


def sse_response(events: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    return StreamingResponse(
        guarded(events),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
