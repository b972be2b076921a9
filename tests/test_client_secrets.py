"""POST /v1/realtime/client_secrets: short-lived `ek_` keys that open /v1/realtime only, until
they expire; minted with the real API key, driven by the openai SDK against a real server."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from openai.types.realtime import ClientSecretCreateResponse
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

import speech
from helpers import whisper_settings
from qwen3_asr_server.api.secret_store import PREFIX, ClientSecretStore
from qwen3_asr_server.app import create_app
from qwen3_asr_server.errors import UnavailableError
from server import LiveServer, live_server
from streaming_client import load
from test_realtime import collect, completed, send_audio
from wer import wer

KEY = "cs-test-key"


class Clock:
    """An epoch clock the test moves by hand."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# --- the store ---------------------------------------------------------------------------


def test_store_mints_random_hashed_secrets_that_expire() -> None:
    clock = Clock()
    store = ClientSecretStore(capacity=3, clock=clock)
    value, granted = store.mint(10, {"type": "transcription"})
    other, _ = store.mint(600, {"type": "transcription"})
    assert value.startswith(PREFIX) and len(value) > 40 and value != other
    assert granted.expires_at == int(clock.now) + 10
    assert value not in repr(store.__dict__)  # only digests are kept
    assert store.lookup(value) == granted
    assert store.lookup(value + "x") is None and store.lookup(KEY) is None
    clock.now += 9.9
    assert store.lookup(value) == granted
    clock.now += 0.1  # at expires_at: gone
    assert store.lookup(value) is None
    assert store.lookup(other) is not None and len(store) == 1


def test_store_is_bounded_and_purges_expired_secrets() -> None:
    clock = Clock()
    store = ClientSecretStore(capacity=2, clock=clock)
    store.mint(10, {})
    store.mint(100, {})
    with pytest.raises(UnavailableError) as refused:
        store.mint(10, {})
    assert refused.value.code == "too_many_client_secrets"
    assert refused.value.retry_after == 10  # when the first one expires
    clock.now += 10
    store.mint(10, {})  # the expired one was purged to make room
    assert len(store) == 2


# --- the route and the WebSocket, on a real server (slow) ----------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(create_app(whisper_settings(api_key=KEY))) as srv:
        srv.ctx.client_secrets.clock = Clock()
        yield srv


def client(srv: LiveServer, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0)


def mint(srv: LiveServer, **params: Any) -> ClientSecretCreateResponse:
    return client(srv).realtime.client_secrets.create(**params)


def realtime_opens(srv: LiveServer, key: str) -> bool:
    """Whether /v1/realtime opens a session for `key` (as the SDK sends it: a bearer)."""
    with client(srv, key).realtime.connect(extra_query={"intent": "transcription"}) as conn:
        event = conn.recv()
        if event.type == "error":
            assert event.error.code == "invalid_api_key"
            return False
        assert event.type == "session.created"
        return True


@pytest.mark.slow
def test_the_sdk_mints_a_secret_and_connects_with_it(server: LiveServer) -> None:
    session = {
        "type": "transcription",
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "transcription": {"language": "en"},
                "turn_detection": {"type": "server_vad", "silence_duration_ms": 400},
            }
        },
        "include": ["item.input_audio_transcription.logprobs"],
    }
    clock = server.ctx.client_secrets.clock
    secret = mint(server, session=session, expires_after={"anchor": "created_at", "seconds": 60})
    raw = secret.model_dump(exclude_unset=True)
    ClientSecretCreateResponse.model_validate(raw)
    assert secret.value.startswith("ek_")
    assert secret.expires_at == int(clock.now) + 60
    assert secret.session.type == "transcription"
    assert secret.session.id.startswith("sess_")
    assert raw["session"]["object"] == "realtime.transcription_session"
    assert raw["session"]["include"] == session["include"]
    assert raw["session"]["audio"]["input"]["transcription"]["language"] == "en"
    assert raw["session"]["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 400
    assert mint(server).expires_at == int(clock.now) + 600  # the default: 10 minutes

    # The SDK with the secret as its key: a session that transcribes.
    audio = np.concatenate([load("sentence_01.wav"), np.zeros(16000, np.float32)])
    ek = client(server, secret.value)
    with ek.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        created = conn.recv()
        assert created.type == "session.created"
        # the secret's session config is the session's defaults
        described = created.model_dump(exclude_unset=True)["session"]
        assert described["audio"]["input"]["transcription"]["language"] == "en"
        assert described["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 400
        assert described["include"] == session["include"]
        send_audio(conn, audio, speed=8.0)
        events = collect(conn, lambda evs: completed(evs), timeout=60)
    expected = speech.transcripts()["sentence_01.wav"]
    assert wer([expected], [completed(events)[0].transcript]) < 0.3
    assert realtime_opens(server, secret.value)  # one secret, several sessions


@pytest.mark.slow
def test_a_secret_in_the_subprotocol_or_the_query_opens_realtime(server: LiveServer) -> None:
    value = mint(server, expires_after={"anchor": "created_at", "seconds": 10}).value
    ws = server.url.replace("http", "ws", 1)
    protocols = ["realtime", f"openai-insecure-api-key.{value}"]
    with ws_connect(f"{ws}/v1/realtime?intent=transcription", subprotocols=protocols) as conn:
        assert conn.subprotocol == "realtime"  # the key is never echoed
        assert json.loads(conn.recv(timeout=30))["type"] == "session.created"
    with ws_connect(f"{ws}/v1/realtime?intent=transcription&api_key={value}") as conn:
        assert json.loads(conn.recv(timeout=30))["type"] == "session.created"


@pytest.mark.slow
def test_an_expired_secret_is_refused(server: LiveServer) -> None:
    clock = server.ctx.client_secrets.clock
    value = mint(server, expires_after={"anchor": "created_at", "seconds": 10}).value
    assert realtime_opens(server, value)
    clock.now += 10
    assert not realtime_opens(server, value)
    assert not realtime_opens(server, "ek_" + "A" * 43)  # never minted
    assert realtime_opens(server, KEY)  # the real key still opens it


@pytest.mark.slow
def test_a_secret_opens_nothing_else(server: LiveServer) -> None:
    value = mint(server).value
    with pytest.raises(openai.AuthenticationError) as refused:  # it cannot mint more
        client(server, value).realtime.client_secrets.create()
    assert "client secret" in refused.value.message
    with pytest.raises(openai.AuthenticationError):
        client(server, value).audio.transcriptions.create(
            model="whisper-1", file=("a.wav", speech.path("sentence_01.wav").read_bytes())
        )
    ws = server.url.replace("http", "ws", 1)
    for url, protocols in (
        (f"{ws}/ws/transcribe?api_key={value}", None),
        (f"{ws}/ws/transcribe", ["realtime", f"openai-insecure-api-key.{value}"]),
    ):
        with ws_connect(url, subprotocols=protocols) as conn:  # type: ignore[arg-type]
            assert json.loads(conn.recv(timeout=30))["code"] == "UNAUTHORIZED"
            with pytest.raises(ConnectionClosed):
                conn.recv(timeout=30)
            assert conn.close_code == 1008
    headers = {"Authorization": f"Bearer {value}"}
    with ws_connect(f"{ws}/ws/transcribe", additional_headers=headers) as conn:
        assert json.loads(conn.recv(timeout=30))["code"] == "UNAUTHORIZED"


def post(srv: LiveServer, body: Any, key: str = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    content = json.dumps(body).encode()  # (a lone surrogate as JSON's escape, as sent)
    return httpx.post(srv.url + "/v1/realtime/client_secrets", content=content, headers=headers)


TRANSCRIPTION = "session.audio.input.transcription"


def transcription(settings: dict[str, Any] | None) -> dict[str, Any]:
    return {"session": {"audio": {"input": {"transcription": settings}}}}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"expires_after": {"anchor": "created_at", "seconds": 9}}, "expires_after.seconds"),
        ({"expires_after": {"anchor": "created_at", "seconds": 7201}}, "expires_after.seconds"),
        ({"expires_after": {"anchor": "now", "seconds": 60}}, "expires_after.anchor"),
        ({"session": {"type": "realtime", "model": "gpt-realtime"}}, "session.type"),
        ({"session": {"type": "transcription", "model": "x"}}, "session.model"),
        ({"session": {"type": "transcription", "include": ["nope"]}}, "session.include"),
        (
            {"session": {"audio": {"input": {"turn_detection": {"threshold": 2}}}}},
            "session.audio.input.turn_detection.threshold",
        ),
        (
            {"session": {"audio": {"input": {"transcription": {"language": "klingon"}}}}},
            "session.audio.input.transcription.language",
        ),
        ({"expires_in": 60}, "expires_in"),
        # checked as a session.update's (issue 49: these were minted, and every connection
        # with them failed and kept its seat)
        (transcription({"keywords": [f"w{i}" for i in range(150)]}), f"{TRANSCRIPTION}.keywords"),
        (transcription({"languages": ["en", "de"]}), f"{TRANSCRIPTION}.languages"),
        (transcription(None), TRANSCRIPTION),
        (transcription({"prompt": "caf\ud83d"}), f"{TRANSCRIPTION}.prompt"),
    ],
)
def test_bad_requests_get_a_clear_400(server: LiveServer, body: Any, param: str) -> None:
    response = post(server, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param and error["message"]


@pytest.mark.slow
def test_a_session_of_type_realtime_is_refused_through_the_sdk(server: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        mint(server, session={"type": "realtime", "model": "gpt-realtime"})
    assert "transcription" in refused.value.message


@pytest.mark.slow
def test_no_key_no_body_and_a_full_store(server: LiveServer) -> None:
    assert post(server, {}, key="wrong").status_code == 401
    assert httpx.post(server.url + "/v1/realtime/client_secrets").status_code == 401
    no_body = httpx.post(
        server.url + "/v1/realtime/client_secrets", headers={"Authorization": f"Bearer {KEY}"}
    )
    assert no_body.status_code == 200 and no_body.json()["value"].startswith("ek_")
    store = server.ctx.client_secrets
    capacity, store.capacity = store.capacity, len(store)
    try:
        full = post(server, {})
        assert full.status_code == 503
        assert full.json()["error"]["code"] == "too_many_client_secrets"
        assert int(full.headers["retry-after"]) >= 1
    finally:
        store.capacity = capacity


@pytest.mark.slow
def test_without_an_api_key_minting_works_and_any_key_opens_realtime() -> None:
    with live_server(create_app(whisper_settings())) as srv:
        secret = client(srv, "unused").realtime.client_secrets.create()
        assert secret.value.startswith("ek_")
        assert realtime_opens(srv, secret.value)
        assert realtime_opens(srv, "unused")


@pytest.mark.slow
def test_a_session_whose_secret_config_fails_gives_its_seat_back() -> None:
    """Whatever fails after a session takes its seat releases it (issue 49: a secret whose
    config failed on connect dropped the socket and kept the seat; WS_MAX_SESSIONS=2 such
    attempts locked every stream out). The bad config goes into the store directly, as
    no request can mint one any more."""
    with live_server(create_app(whisper_settings(api_key=KEY, ws_max_sessions=2))) as srv:
        bad = {
            "type": "transcription",
            **transcription({"keywords": [f"w{i}" for i in range(150)]})["session"],
        }
        value, _ = srv.ctx.client_secrets.mint(600, bad)
        for _ in range(3):
            with client(srv, value).realtime.connect(
                extra_query={"intent": "transcription"}
            ) as conn:
                event = conn.recv()
                assert event.type == "error", event
                assert event.error.param == f"{TRANSCRIPTION}.keywords"
                with pytest.raises(ConnectionClosed):
                    conn.recv()
        deadline = time.monotonic() + 30
        while len(srv.ctx.sessions) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert srv.get("/health").json()["streaming_sessions"] == 0
        assert realtime_opens(srv, KEY) and realtime_opens(srv, KEY)


def test_a_body_larger_than_a_websocket_message_is_refused_unread(server: LiveServer) -> None:
    """Issue 58 §7.1: the body (up to MAX_UPLOAD_MB, about 101 MB) was parsed on the event
    loop, and its keywords checked in quadratic time. A session config is capped at
    WS_MAX_FRAME_BYTES (1 MiB) like a session.update; 100,000 keywords under that get a 400
    at once."""
    many = transcription({"keywords": [f"w{i}" for i in range(100_000)]})
    started = time.monotonic()
    response = post(server, many)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == f"{TRANSCRIPTION}.keywords"
    assert time.monotonic() - started < 30  # was minutes: the dedupe was quadratic
    big = transcription({"prompt": "x" * 1_100_000})
    response = post(server, big)
    assert response.status_code == 413, response.text
    assert "1048576 bytes" in response.json()["error"]["message"]
    assert post(server, {}).status_code == 200  # the next request is served
