"""The OpenAPI document states the errors the server really sends: OpenAI's error body, 400
for invalid input (FastAPI would document a 422 `HTTPValidationError` that never happens),
422 only where the seed server used it."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from .error_handlers import MISSING_FIELD_422_ROUTES

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
ERRORS = {
    "400": "Invalid request (bad field, undecodable audio: code invalid_audio).",
    "401": "Missing or wrong API key (when API_KEY is set).",
    "404": "No such model.",
    "413": "Upload or audio too large.",
    "422": "A required field is missing (the seed server's status on this route).",
    "501": "Translation is not configured.",
    "503": "Queue full, model unavailable or too many live client secrets; see Retry-After.",
    "504": "The request did not finish within REQUEST_TIMEOUT.",
}


def statuses(path: str, method: str, validates: bool) -> list[str]:
    """The error statuses a route can answer."""
    out = ["400"] if validates else []
    if path.startswith("/v1/"):
        out.append("401")
    if "{" in path:
        out.append("404")
    if method == "post":
        out += ["413", "503", "504"]
    if path.endswith("/translations"):
        out.append("501")
    if path in MISSING_FIELD_422_ROUTES:
        out.append("422")
    return out


def install_openapi(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schema.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
            ref = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
            for path, operations in schema.get("paths", {}).items():
                for method, operation in operations.items():
                    responses = operation.setdefault("responses", {})
                    validates = responses.pop("422", None) is not None
                    for status in statuses(path, method, validates):
                        responses[status] = {"description": ERRORS[status], "content": ref}
            for name in ("HTTPValidationError", "ValidationError"):
                schema["components"]["schemas"].pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
