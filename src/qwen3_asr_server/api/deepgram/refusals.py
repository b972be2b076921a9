"""Deepgram's HTTP error body (`err_code`, `err_msg`, `request_id`), built in one place for
every /v1/listen refusal: the key and body-size checks of `api/middleware.py`, the POST's
errors (`prerecorded.py`) and the WebSocket handshake's (`live.py`); and the path itself.
Imports only `messages.py`, so the middleware can use it without an import circle."""

from __future__ import annotations

from typing import Any

from ...logging import REQUEST_ID
from . import messages as m

LISTEN_PATH = "/v1/listen"  # Deepgram's route, pre-recorded (POST) and live (WebSocket)
INVALID_AUTH = "INVALID_AUTH"
TOO_MANY_REQUESTS = "TOO_MANY_REQUESTS"  # Deepgram's overload (429, to retry)
ERR_CODES = {
    400: "Bad Request",
    401: INVALID_AUTH,
    413: "PAYLOAD_TOO_LARGE",
    429: TOO_MANY_REQUESTS,
}


def err_code(status: int) -> str:
    """Deepgram's `err_code` for an HTTP status."""
    return ERR_CODES.get(status, "INTERNAL_SERVER_ERROR" if status >= 500 else "ERROR")


def error_body(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """The body of a refusal (`code`, else the status's code), with this request's id."""
    refusal = m.HandshakeError(
        err_code=code or err_code(status), err_msg=message, request_id=REQUEST_ID.get()
    )
    return m.dump(refusal)
