"""Pure ASGI middleware: request ids, last-resort errors, releases at the end of a request,
the API key check and the upload size limit."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from loguru import logger
from starlette.routing import get_route_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import AuthError
from ..logging import REQUEST_ID
from ..runtime.metrics import Metrics
from .deepgram.refusals import LISTEN_PATH
from .deepgram.refusals import error_body as deepgram_body
from .deps import check_api_key
from .error_table import error_body, http_status, openai_body

HEADER = b"x-request-id"
# A client's request id is kept if it is printable ASCII without spaces, up to 128
# characters; any other (control characters, non-ASCII: it could forge a text log line, and
# would come back with other bytes) is replaced by a fresh one (issue 58 §7.9).
SAFE_ID = re.compile(r"[\x21-\x7e]{1,128}")
MODEL_HEADER = b"x-model-id"  # on every answer of /v1/audio/*: the model that answered
RELEASES = "qwen3_asr_server.releases"  # scope key: callables to run when the request ends
# The HTTP routes that need no API key: they hold no data and start no work. The health
# check, the browser page (it asks for the key itself, docs/WEB.md) and the API docs.
OPEN_PATHS = frozenset(
    {
        "/health",
        "/",
        "/ui",
        "/ui/languages.json",
        "/openapi.json",
        "/docs",
        "/docs/oauth2-redirect",
        "/redoc",
    }
)
OPEN_PREFIXES = ("/ui/static/",)  # the page's files


def is_open(path: str) -> bool:
    """An HTTP path anyone may request when API_KEY is set; every other one needs the key."""
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


def served_model(scope: Scope) -> str | None:
    """The served model's id for an HTTP answer under /v1/audio/ (issue 33: the bundled
    model may serve in the default's place), else None."""
    if scope["type"] != "http" or not get_route_path(scope).startswith("/v1/audio/"):
        return None
    ctx = getattr(getattr(scope.get("app"), "state", None), "ctx", None)
    return None if ctx is None else str(ctx.manager.engine.model_id)


def on_request_end(scope: Scope, release: Callable[[], None]) -> None:
    """Run `release` once the request has ended, however it ended: response sent, client
    gone mid-stream, or an error."""
    scope[RELEASES].append(release)


def _error_response(status: int, body: dict[str, Any], request_id: str) -> tuple[Message, Message]:
    payload = json.dumps(body).encode()
    start: Message = {
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (HEADER, request_id.encode()),
        ],
    }
    return start, {"type": "http.response.body", "body": payload}


class RequestContextMiddleware:
    """Give every request an id (the client's X-Request-ID or a new one), put it in the
    logging context and on the response, turn an unhandled exception into a 500 in
    OpenAI's error shape (with the id) instead of a bare text body, and run the request's
    releases (`on_request_end`) when it is over."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(HEADER, b"").decode("latin-1")
        if scope["type"] == "websocket" and not given:
            qs = scope.get("query_string", b"").decode("latin-1")
            given = next((p[11:] for p in qs.split("&") if p.startswith("request_id=")), "")
        request_id = given if SAFE_ID.fullmatch(given) else uuid.uuid4().hex
        token = REQUEST_ID.set(request_id)
        scope[RELEASES] = []
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                headers.append((HEADER, request_id.encode()))
                model = served_model(scope)
                if model and message["status"] < 400:
                    headers.append((MODEL_HEADER, model.encode("latin-1", "replace")))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as exc:
            logger.opt(exception=exc).error("unhandled error")
            if scope["type"] != "http" or started:
                raise
            body = error_body("Internal server error.", "server_error", None, "internal_error")
            for message in _error_response(500, body, request_id):
                await send(message)
        finally:
            for release in scope.pop(RELEASES):
                release()
            REQUEST_ID.reset(token)


class MetricsMiddleware:
    """Count HTTP requests by route template (never the raw path: bounded label values)
    and status, and time them."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.observe_request(route, status, time.perf_counter() - started)


class ApiKeyMiddleware:
    """With API_KEY set, answer an HTTP request that lacks the key with 401 (OpenAI's error
    body) from its headers alone, before any of its body is read; every path but the open
    ones (`is_open`) needs it, so a new route is protected by default. A client secret
    (`ek_…`) is refused here like any wrong key. WebSocket scopes pass through: those routes
    check the key themselves (header, `api_key` query or subprotocol, and on /v1/realtime a
    client secret: api/live/common.py), after accepting, so the client hears why. POST
    /v1/listen (Deepgram's) also takes `Token <key>`, and its 401 is Deepgram's shape."""

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # the path as routed (without a --root-path prefix), as the routes see it
        if scope["type"] == "http" and self.api_key and not is_open(get_route_path(scope)):
            authorization = dict(scope.get("headers") or []).get(b"authorization")
            given = authorization and authorization.decode("latin-1")
            deepgram = get_route_path(scope) == LISTEN_PATH  # its 401 is Deepgram's shape
            if deepgram and given and given[:6].lower() == "token ":  # Deepgram's scheme
                given = "Bearer " + given[6:]
            try:
                check_api_key(self.api_key, given)
            except AuthError as exc:
                status = http_status(exc)
                body = deepgram_body(status, exc.message) if deepgram else openai_body(exc)
                for message in _error_response(status, body, REQUEST_ID.get()):
                    await send(message)
                return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Reject request bodies over `max_bytes` with 413 before they are buffered.

    A declared Content-Length over the limit is refused without reading. A body that
    grows past the limit while streaming is cut off and answered with 413. The message names
    `limit_mb` (MAX_UPLOAD_MB), the file's limit: `max_bytes` adds the form's slack to it.
    On POST /v1/listen the body is Deepgram's shape (`api/deepgram/refusals.py`).
    """

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        limit_mb: float,
        json_paths: tuple[str, ...] = (),
        json_max_bytes: int = 1_048_576,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.limit_mb = limit_mb
        # routes whose JSON body is parsed on the event loop: a small limit of their own
        self.json_paths = json_paths
        self.json_max_bytes = json_max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        request_id = REQUEST_ID.get()
        path = get_route_path(scope)
        deepgram = path == LISTEN_PATH
        limit = self.json_max_bytes if path in self.json_paths else self.max_bytes
        body = self._body(deepgram) if limit == self.max_bytes else self._json_body()
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            for message in _error_response(413, body, request_id):
                await send(message)
            return
        seen = 0
        exceeded = False

        async def counting_receive() -> Message:
            nonlocal seen, exceeded
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    exceeded = True
                    return {"type": "http.disconnect"}
            return message

        sent_error = False

        async def guarded_send(message: Message) -> None:
            nonlocal sent_error
            if not exceeded:
                await send(message)
            elif not sent_error:  # replace whatever the app answered to the cut-off body
                sent_error = True
                for replacement in _error_response(413, body, request_id):
                    await send(replacement)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except Exception:
            if not exceeded:
                raise
        if exceeded and not sent_error:
            for message in _error_response(413, body, request_id):
                await send(message)

    def _json_body(self) -> dict[str, Any]:
        return error_body(
            f"The request body is larger than {self.json_max_bytes} bytes (WS_MAX_FRAME_BYTES).",
            "invalid_request_error",
            None,
            "too_large",
        )

    def _body(self, deepgram: bool) -> dict[str, Any]:
        message = f"The upload is larger than the {self.limit_mb:g} MB limit (MAX_UPLOAD_MB)."
        if deepgram:
            return deepgram_body(413, message)
        return error_body(
            message,
            "invalid_request_error",
            "file",
            "too_large",
        )
