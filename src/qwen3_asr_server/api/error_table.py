"""The one table from domain errors (`errors.py`) to HTTP: each error class's status and
OpenAI error type, OpenAI's `{"error": {...}}` body and the headers (Retry-After). An error
is looked up by its class's MRO, so the most specific row wins and a subclass without a
row of its own answers as its parent."""

from __future__ import annotations

from typing import Any

from ..errors import (
    AuthError,
    BadRequestError,
    InferenceError,
    InvalidAudioError,
    ModelUnavailableError,
    NotConfiguredError,
    NotFoundError,
    QueueFullError,
    RequestTimeoutError,
    ServiceError,
    TooLargeError,
    UnavailableError,
    UpstreamError,
)
from .disconnect import ClientClosedError

INVALID = "invalid_request_error"
SERVER = "server_error"

# error class -> (HTTP status, OpenAI error type)
ERROR_TABLE: dict[type[ServiceError], tuple[int, str]] = {
    InvalidAudioError: (400, INVALID),
    BadRequestError: (400, INVALID),
    AuthError: (401, INVALID),
    NotFoundError: (404, INVALID),
    TooLargeError: (413, INVALID),
    ClientClosedError: (499, INVALID),  # nobody reads it; logs and metrics do
    InferenceError: (500, SERVER),
    NotConfiguredError: (501, SERVER),
    UpstreamError: (502, SERVER),
    QueueFullError: (503, SERVER),
    ModelUnavailableError: (503, SERVER),
    UnavailableError: (503, SERVER),
    RequestTimeoutError: (504, SERVER),
    ServiceError: (500, SERVER),
}


def http_of(exc: ServiceError) -> tuple[int, str]:
    """(HTTP status, OpenAI error type) of a domain error: its most specific row."""
    for cls in type(exc).__mro__:
        row = ERROR_TABLE.get(cls)
        if row is not None:
            return row
    raise AssertionError("ServiceError has a row")  # pragma: no cover


def http_status(exc: ServiceError) -> int:
    return http_of(exc)[0]


def error_body(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error body."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def openai_body(exc: ServiceError) -> dict[str, Any]:
    return error_body(exc.message, http_of(exc)[1], exc.param, exc.code)


def http_headers(exc: ServiceError) -> dict[str, str]:
    return {} if exc.retry_after is None else {"Retry-After": str(exc.retry_after)}
