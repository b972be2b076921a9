"""Typed API errors: a status, and OpenAI's error body. No web framework here: the
handlers that answer them are `api/error_handlers.py`, so importing the scheduler or the
service imports no FastAPI."""

from __future__ import annotations

from typing import Any


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
