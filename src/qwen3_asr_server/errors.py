"""Typed API errors and the handlers that turn every failure into OpenAI's error body."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from loguru import logger
from starlette.exceptions import HTTPException as StarletteHTTPException


class APIError(Exception):
    """An error with an HTTP status and OpenAI's `{"error": {...}}` body."""

    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


class BadRequestError(APIError):
    status = 400
    type = "invalid_request_error"


class AuthError(APIError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class NotFoundError(APIError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class TooLargeError(APIError):
    status = 413
    type = "invalid_request_error"
    code = "too_large"


class InvalidAudioError(BadRequestError):
    """The bytes are not audio any decoder understands: 400 `invalid_audio`, as OpenAI says."""

    code = "invalid_audio"


class ServiceUnavailableError(APIError):
    """Queue full or model unavailable; carries Retry-After."""

    status = 503
    type = "server_error"

    def __init__(self, message: str, *, code: str, retry_after: int = 1) -> None:
        super().__init__(message, code=code, headers={"Retry-After": str(retry_after)})


class QueueFullError(ServiceUnavailableError):
    def __init__(self, message: str = "The inference queue is full; retry shortly.") -> None:
        super().__init__(message, code="queue_full", retry_after=1)


class ModelUnavailableError(ServiceUnavailableError):
    def __init__(self, message: str) -> None:
        super().__init__(message, code="model_unavailable", retry_after=10)


class NotConfiguredError(APIError):
    status = 501
    type = "server_error"
    code = "not_configured"


class BadGatewayError(APIError):
    status = 502
    type = "server_error"
    code = "upstream_failed"


class RequestTimeoutError(APIError):
    status = 504
    type = "server_error"
    code = "timeout"


class InferenceError(APIError):
    status = 500
    type = "server_error"
    code = "inference_failed"


def error_body(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _json(
    status: int, body: dict[str, Any], headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(status_code=status, content=body, headers=headers)


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    if exc.status >= 500:
        logger.warning("{} {}: {}", exc.status, exc.code, exc.message)
    return _json(exc.status, exc.body(), exc.headers)


# Seed-only routes (no OpenAI counterpart) where a missing required field keeps the seed's
# status, FastAPI's 422; every other validation error is OpenAI's 400.
MISSING_FIELD_422_ROUTES = frozenset({"/v1/audio/subtitles"})


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
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


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    type_ = "invalid_request_error" if exc.status_code < 500 else "server_error"
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return _json(exc.status_code, error_body(str(exc.detail), type_, None, code), exc.headers)


def install_error_handlers(app: FastAPI) -> None:
    """Unhandled exceptions are answered by RequestContextMiddleware (api/middleware.py)."""
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
