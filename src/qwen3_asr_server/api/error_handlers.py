"""The handlers that turn every failure into OpenAI's error body (the errors themselves are
`errors.py`; their statuses and bodies, `api/error_table.py`)."""

from __future__ import annotations

import errno
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from loguru import logger
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import ServiceError
from .error_table import error_body, http_headers, http_status, openai_body


def _json(
    status: int, body: dict[str, Any], headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(status_code=status, content=body, headers=headers)


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    status = http_status(exc)
    if status >= 500:
        logger.warning("{} {}: {}", status, exc.code, exc.message)
    return _json(status, openai_body(exc), http_headers(exc))


# Seed-only routes (no OpenAI counterpart) where a missing required field keeps the seed's
# status, FastAPI's 422; every other validation error is OpenAI's 400.
MISSING_FIELD_422_ROUTES = frozenset({"/v1/audio/subtitles"})


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":  # its loc is a character offset, not a field
        why = str((first.get("ctx") or {}).get("error", ""))[:100]
        message = f"The request body is not valid JSON ({why}, at character {first['loc'][-1]})."
        return _json(400, error_body(message, "invalid_request_error", None, "invalid_json"))
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "header")]
    param = ".".join(loc) or None
    message = f"{param}: {first.get('msg', 'invalid value')}" if param else "Invalid request."
    if param == "file" and "UploadFile" in message:  # a text field, or filename="" (same thing)
        message = (
            "file: a file is required. Send the audio as a multipart file part with a "
            'filename (a part with filename="" arrives as a plain text field).'
        )
    route = getattr(request.scope.get("route"), "path", None)
    missing = first.get("type") == "missing"
    status = 422 if missing and route in MISSING_FIELD_422_ROUTES else 400
    return _json(status, error_body(message, "invalid_request_error", param, "invalid_value"))


# Writing a spooled upload failed for want of room: the disk (or quota) is full, or the
# process's file size limit is reached (issue 58 §7.4).
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def disk_full(exc: BaseException) -> OSError | None:
    """The OSError of a full temp disk behind `exc` (its cause chain), if that is what it is."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return None
        if isinstance(seen, OSError) and seen.errno in DISK_FULL:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    full = disk_full(exc)
    if full is not None:  # FastAPI calls it "an error parsing the body"
        logger.error("an upload could not be spooled to the temp disk: {}", full)
        message = (
            "The server's temporary disk is full: the upload could not be stored. Try again "
            "later; the operator must free space in the temp directory (TMPDIR)."
        )
        return _json(507, error_body(message, "server_error", None, "insufficient_storage"))
    type_ = "invalid_request_error" if exc.status_code < 500 else "server_error"
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return _json(exc.status_code, error_body(str(exc.detail), type_, None, code), exc.headers)


def install_error_handlers(app: FastAPI) -> None:
    """Unhandled exceptions are answered by RequestContextMiddleware (api/middleware.py)."""
    app.add_exception_handler(ServiceError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
