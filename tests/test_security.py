"""API_KEY is checked from the headers before a body is read, on every HTTP route but the open
ones (a new route is protected by default); CORS_ALLOW_ORIGINS lets browser apps on other
origins call the API, preflights included; backend URLs never show their passwords."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastapi.routing
import httpx
import pytest
from starlette.routing import Mount

from helpers import whisper_settings
from qwen3_asr_server.app import create_app
from qwen3_asr_server.engines.remote.pool import BackendPool, split_credentials
from qwen3_asr_server.logging import redact_url
from server import LiveServer, live_server

KEY = "k3y"
PART = (  # the start of a multipart upload: a file part's headers and its first bytes
    b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
    b"Content-Type: audio/wav\r\n\r\n" + b"\0" * 1024
)
README = Path(__file__).resolve().parent.parent / "README.md"
# Every HTTP route that answers without the key when API_KEY is set (README: Auth and CORS).
OPEN = {
    ("GET", "/health"),
    ("GET", "/"),
    ("GET", "/ui"),
    ("GET", "/ui/languages.json"),
    ("GET", "/ui/static/index.html"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/docs/oauth2-redirect"),
    ("GET", "/redoc"),
}


def raw_request(
    srv: LiveServer, head: dict[str, str], body: bytes, timeout: float
) -> tuple[int, dict[str, str], bytes]:
    """Send a POST's headers and `body` (maybe much less than its Content-Length) on a raw
    socket; read the answer (socket.timeout if none comes within `timeout`)."""
    lines = ["POST /v1/audio/transcriptions HTTP/1.1", f"Host: 127.0.0.1:{srv.port}"]
    lines += [f"{k}: {v}" for k, v in head.items()]
    with socket.create_connection(("127.0.0.1", srv.port), timeout=timeout) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        data = b""

        def more() -> bytes:
            chunk = sock.recv(65536)
            assert chunk, "the server closed the connection without an answer"
            return chunk

        while b"\r\n\r\n" not in data:
            data += more()
        header, _, rest = data.partition(b"\r\n\r\n")
        status_line, *fields = header.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (f.partition(":") for f in fields)}
        while len(rest) < int(headers.get("content-length", 0)):
            rest += more()
    return int(status_line.split()[1]), headers, rest


@pytest.fixture(scope="module")
def keyed() -> Iterator[LiveServer]:
    """API_KEY set, nothing else; the tests on it leave nothing another asserts on."""
    with live_server(create_app(whisper_settings(api_key=KEY))) as srv:
        yield srv


@pytest.mark.slow
def test_a_request_without_the_key_gets_401_before_its_body_is_sent(keyed: LiveServer) -> None:
    """50 MB declared, 1 kB sent: the 401 comes at once (the body was never waited for)."""
    srv = keyed
    head = {
        "Content-Type": "multipart/form-data; boundary=xyz",
        "Content-Length": str(50_000_000),
        "X-Request-ID": "rid-early-401",
    }
    for auth in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        started = time.monotonic()
        status, headers, body = raw_request(srv, {**head, **auth}, PART, 10)
        assert time.monotonic() - started < 5
        assert status == 401
        assert headers["x-request-id"] == "rid-early-401"
        assert headers["content-type"] == "application/json"
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == "invalid_api_key"
    # With the key the server does wait for the rest of the body.
    with pytest.raises(TimeoutError):
        raw_request(srv, {**head, "Authorization": f"Bearer {KEY}"}, PART, 1.5)


def error_of(route: tuple[str, str], response: httpx.Response) -> tuple[str, str]:
    """(code, message) of a 401: OpenAI's body, or Deepgram's on its /v1/listen."""
    body = response.json()
    if route[1] == "/v1/listen":
        assert set(body) == {"err_code", "err_msg", "request_id"}, body
        return {"INVALID_AUTH": "invalid_api_key"}.get(body["err_code"], ""), body["err_msg"]
    return body["error"]["code"], body["error"]["message"]


def http_routes(srv: LiveServer) -> set[tuple[str, str]]:
    """(method, a path it matches) for every HTTP route and mount of the app."""
    # FastAPI 0.13x+ keeps included routers nested; iter_route_contexts flattens them.
    flatten = getattr(fastapi.routing, "iter_route_contexts", iter)
    found = set()
    for route in flatten(srv.app.routes):
        if isinstance(getattr(route, "original_route", route), Mount):
            found.add(("GET", f"{route.path}/index.html"))
        else:  # WebSocket routes have no methods: they check the key themselves
            path = re.sub(r"\{[^}]+\}", "x", route.path)
            found |= {(m, path) for m in getattr(route, "methods", None) or () if m != "HEAD"}
    return found


@pytest.mark.slow
def test_only_the_listed_routes_are_open_and_a_new_route_needs_the_key() -> None:
    app = create_app(whisper_settings(api_key=KEY))

    @app.get("/v1/added-later")  # no auth dependency of its own
    async def added_later() -> dict[str, Any]:
        return {"secret": "data"}

    with live_server(app) as srv:
        routes = http_routes(srv) | {("GET", "/no/such/route"), ("OPTIONS", "/v1/models")}
        assert routes >= OPEN and ("GET", "/v1/added-later") in routes
        answers = {r: httpx.request(r[0], srv.url + r[1], timeout=30) for r in sorted(routes)}
        opened = {r for r, response in answers.items() if response.status_code != 401}
        assert opened == OPEN
        for route, response in answers.items():
            if route not in OPEN:
                assert error_of(route, response)[0] == "invalid_api_key", route
                assert response.headers["x-request-id"], route
        with_key = httpx.get(
            srv.url + "/v1/added-later", headers={"Authorization": f"Bearer {KEY}"}
        )
        assert with_key.json() == {"secret": "data"}
    text = README.read_text()
    for _, path in OPEN:
        documented = "/ui/static/" if path.startswith("/ui/static/") else path
        assert f"`{documented}`" in text, path


@pytest.mark.slow
def test_a_client_secret_opens_no_http_route(keyed: LiveServer) -> None:
    """An `ek_` key (POST /v1/realtime/client_secrets) opens the /v1/realtime WebSocket
    only: on every HTTP route it is a wrong key, client_secrets itself included."""
    srv = keyed
    minted = httpx.post(
        srv.url + "/v1/realtime/client_secrets", headers={"Authorization": f"Bearer {KEY}"}
    )
    secret = minted.json()["value"]
    assert secret.startswith("ek_")
    auth = {"Authorization": f"Bearer {secret}"}
    for route in sorted(http_routes(srv) - OPEN):
        response = httpx.request(route[0], srv.url + route[1], headers=auth, timeout=30)
        assert response.status_code == 401, route
        code, message = error_of(route, response)
        assert code == "invalid_api_key" and "client secret" in message


def preflight(srv: LiveServer, origin: str) -> httpx.Response:
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    return httpx.options(srv.url + "/v1/audio/transcriptions", headers=headers, timeout=10)


@pytest.mark.slow
def test_cors_preflight_and_requests_from_an_allowed_origin_with_an_api_key() -> None:
    origins = "https://app.example, https://other.example/"
    app = create_app(whisper_settings(api_key=KEY, cors_allow_origins=origins))
    with live_server(app) as srv:
        for origin in ("https://app.example", "https://other.example"):
            r = preflight(srv, origin)
            assert r.status_code == 200, r.text
            assert r.headers["access-control-allow-origin"] == origin
            assert "POST" in r.headers["access-control-allow-methods"]
            assert "authorization" in r.headers["access-control-allow-headers"].lower()
            assert r.headers["x-request-id"]
        origin = {"Origin": "https://app.example"}
        ok = httpx.get(srv.url + "/v1/models", headers={**origin, "Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200
        assert ok.headers["access-control-allow-origin"] == "https://app.example"
        exposed = ok.headers["access-control-expose-headers"].lower()
        assert "x-request-id" in exposed and "retry-after" in exposed
        denied = httpx.get(srv.url + "/v1/models", headers=origin)  # the page can read the 401
        assert denied.status_code == 401
        assert denied.headers["access-control-allow-origin"] == "https://app.example"
        stranger = preflight(srv, "https://evil.example")
        assert "access-control-allow-origin" not in stranger.headers


@pytest.mark.slow
def test_no_cors_headers_by_default() -> None:
    with live_server(create_app(whisper_settings())) as srv:
        responses = [
            preflight(srv, "https://app.example"),
            httpx.get(srv.url + "/health", headers={"Origin": "https://app.example"}),
        ]
        assert responses[0].status_code == 405
        for r in responses:
            assert not [h for h in r.headers if h.lower().startswith("access-control-")]


def test_cors_origins_setting_is_a_comma_separated_list() -> None:
    settings = whisper_settings(cors_allow_origins=" https://a.example/ ,, * ")
    assert settings.cors_origins == ["https://a.example", "*"]
    assert whisper_settings().cors_origins == []


def test_backend_urls_are_shown_without_their_password() -> None:
    assert redact_url("http://user:pa%40ss@gpu-a:8000/v1") == "http://user:***@gpu-a:8000/v1"
    assert redact_url("https://token@gpu-a/v1?x=a@b") == "https://***@gpu-a/v1?x=a@b"
    assert redact_url("user:p@ss@gpu-a:8000") == "user:***@gpu-a:8000"
    assert redact_url("http://gpu-a:8000/v1/a@b") == "http://gpu-a:8000/v1/a@b"
    url, auth = split_credentials("http://user:pa%40ss@gpu-a:8000/v1")
    assert (url, auth) == ("http://gpu-a:8000/v1", "Basic dXNlcjpwYUBzcw==")  # user:pa@ss
    assert split_credentials("http://gpu-a:8000/v1") == ("http://gpu-a:8000/v1", None)
    backend = BackendPool(["http://user:pa%40ss@gpu-a:8000/v1"], 1, 5.0).backends[0]
    assert backend.url == "http://gpu-a:8000/v1"
    assert backend.label == "http://user:***@gpu-a:8000/v1"
    assert (
        "pa%40ss" not in repr(backend)
        and "pa@ss" not in repr(backend)
        and backend.status(0.0)["url"] == backend.label
    )


async def test_open_routes_stay_open_behind_a_root_path() -> None:
    """Behind `--root-path /asr`, uvicorn puts the prefix in `path`: the key check must use
    the routed path (it asked for a key on /asr/health), and still guard /asr/v1/models."""
    from qwen3_asr_server.api.middleware import ApiKeyMiddleware

    reached: list[str] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["path"])

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    guard = ApiKeyMiddleware(inner, "secret")
    for path in ("/asr/health", "/asr/v1/models"):
        scope = {"type": "http", "path": path, "root_path": "/asr", "headers": []}
        await guard(scope, receive, send)
    assert reached == ["/asr/health"]
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [401]
