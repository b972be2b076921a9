"""POST /v1/listen with a JSON `{"url": ...}` body (issue 52): off unless LISTEN_URL_HOSTS
lists hosts, then fetched only from those hosts and never from this machine's own networks
(api/deepgram/fetch.py). The audio is served by a real `http.server` on 127.0.0.1; since
the guard refuses loopback addresses, the tests that must get through it give it a `vet`
that tells it the test's host name `audio.test` is public and at 127.0.0.1 (every other name
goes through the real check). The route is driven by the real deepgram-sdk against a real
uvicorn serving whisper-tiny.en."""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import select
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import pytest
import trustme
from deepgram import DeepgramClient
from deepgram.core.api_error import ApiError
from deepgram.environment import DeepgramClientEnvironment

from helpers import whisper_settings
from qwen3_asr_server.api.deepgram import fetch, prerecorded
from qwen3_asr_server.api.deepgram.fetch import (
    UrlFetcher,
    Vet,
    host_allowed,
    host_patterns,
    is_public,
    public_addresses,
)
from qwen3_asr_server.app import create_app
from qwen3_asr_server.errors import BadRequestError, TooLargeError, UpstreamError
from server import LiveServer, live_server
from speech import transcripts
from wer import wer

KEY = "dg-test-key"
SPEECH = Path(__file__).parent / "data" / "speech"
WAV = (SPEECH / "three_sentences.wav").read_bytes()
HOSTS = "localhost,audio.test,169.254.169.254,*.example.org"


class AudioServer(ThreadingHTTPServer):
    """Serves /speech/NAME, /redirect?URL (302), /status/N, /endless (no length, 20 MB),
    /trickle (a byte every 0.2 s),
    /hang (headers, then nothing until `release`), /hold (as /hang, and `hung_up` set when
    the fetcher closes the connection), /gzip; keeps what it was asked."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.asked: list[tuple[str, str]] = []  # (path, Host header)
        self.release = threading.Event()
        self.hung_up = threading.Event()
        self.port = self.server_address[1]


class Handler(BaseHTTPRequestHandler):
    server: AudioServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.server.asked.append((self.path, self.headers.get("Host", "")))
        path, _, arg = self.path.partition("?")
        if path.startswith("/speech/"):
            wav = (SPEECH / path.removeprefix("/speech/")).read_bytes()
            self.reply(200, wav, {"Content-Type": "audio/wav"})
        elif path == "/redirect":
            self.send_response(302)
            self.send_header("Location", unquote(arg))
            self.end_headers()
        elif path.startswith("/status/"):
            self.reply(int(path.removeprefix("/status/")), b"nope")
        elif path == "/trickle":  # a byte every 0.2 s, until the fetcher hangs up
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            for _ in range(1000):
                try:
                    self.wfile.write(b"\0")
                    self.wfile.flush()
                except OSError:
                    return
                if self.server.release.wait(0.2):
                    return
        elif path == "/gzip":
            self.reply(200, WAV, {"Content-Encoding": "gzip"})
        elif path == "/hold":
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.flush()
            while not self.server.release.is_set():
                readable = select.select([self.connection], [], [], 0.05)[0]
                if readable and not self.connection.recv(1):  # the fetcher hung up
                    self.server.hung_up.set()
                    return
        else:
            self.send_response(200)
            self.end_headers()
            if path == "/hang":
                self.server.release.wait(60)
            for _ in range(320) if path == "/endless" else ():
                try:
                    self.wfile.write(b"\0" * 65536)
                except OSError:
                    break

    def reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


def serving(tls: ssl.SSLContext | None = None) -> Iterator[AudioServer]:
    srv = AudioServer()
    if tls is not None:
        srv.socket = tls.wrap_socket(srv.socket, server_side=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.release.set()
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def audio() -> Iterator[AudioServer]:
    yield from serving()


def told_public(*names: str) -> Vet:
    """The guard's check, except that `names` are taken as public hosts at 127.0.0.1."""

    async def vet(host: str, port: int) -> list[str]:
        return ["127.0.0.1"] if host in names else await public_addresses(host, port)

    return vet


def fetcher(max_bytes: int = 10_000_000, **kwargs: Any) -> UrlFetcher:
    return UrlFetcher(host_patterns(HOSTS), max_bytes, told_public("audio.test"), **kwargs)


async def fetched(f: UrlFetcher, url: str) -> tuple[bytes, str]:
    got = bytearray()

    async def write(chunk: bytes) -> None:
        got.extend(chunk)

    kind = await f.fetch(url, write)
    return bytes(got), kind


def test_host_patterns_match_names_and_subdomains_only() -> None:
    patterns = host_patterns(" Audio.Example.com., *.example.org ,,")
    assert patterns == ("audio.example.com", "*.example.org")
    assert host_allowed("AUDIO.example.com", patterns)
    assert host_allowed("a.b.example.org", patterns) and host_allowed("b.example.org.", patterns)
    for host in ("example.org", "evilexample.org", "example.org.evil.com", "example.com"):
        assert not host_allowed(host, patterns), host
    assert host_allowed("anything.net", host_patterns("*")) and not host_patterns(None)


def test_only_public_addresses_pass() -> None:
    refused = [
        "127.0.0.1", "127.5.5.5", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",
        "100.64.0.1", "0.0.0.0", "224.0.0.1", "239.255.255.250", "240.0.0.1",
        "255.255.255.255", "192.0.2.1", "::1", "::", "fe80::1", "fc00::1", "fd12::1",
        "ff02::1", "::ffff:127.0.0.1", "::ffff:169.254.169.254", "::ffff:10.0.0.1",
        "2002:7f00:1::1", "2002:a9fe:a9fe::", "64:ff9b::a9fe:a9fe", "64:ff9b::7f00:1",
        "2001:db8::1", "2001::1", "fec0::1", "feff::1", "3fff::1", "3fff:fff::1",
    ]  # fmt: skip
    for address in refused:
        assert not is_public(ipaddress.ip_address(address)), address
    for address in ("8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8",
                    "64:ff9b::808:808", "2002:808:808::1"):  # fmt: skip
        assert is_public(ipaddress.ip_address(address)), address


async def test_a_name_of_this_machine_is_refused_by_the_real_check() -> None:
    with pytest.raises(BadRequestError, match="this machine") as refused:
        await public_addresses("localhost", 80)
    assert "127.0.0.1" in refused.value.message or "::1" in refused.value.message


async def test_a_url_fetched_at_the_checked_address_with_its_host_header(
    audio: AudioServer,
) -> None:
    """Unit level: `audio.test` does not resolve at all; the fetch connects to the address
    the vet gave (127.0.0.1), with the name in `Host`, and hands back every byte."""
    body, kind = await fetched(
        fetcher(), f"http://audio.test:{audio.port}/speech/three_sentences.wav"
    )
    assert body == WAV and kind == "audio/wav"
    assert audio.asked == [("/speech/three_sentences.wav", f"audio.test:{audio.port}")]


async def test_refused_before_any_request(audio: AudioServer) -> None:
    """A scheme other than http(s), a host not listed (127.0.0.1 itself included), a listed
    name of this machine (the SSRF case) and a listed metadata address: nothing is asked."""
    p = audio.port
    for url, says in (
        ("ftp://audio.test/a.wav", "http or https"),
        ("file:///etc/passwd", "http or https"),
        ("not a url", "http or https"),
        (f"http://127.0.0.1:{p}/speech/three_sentences.wav", "LISTEN_URL_HOSTS"),
        ("https://evil.example.com/a.wav", "LISTEN_URL_HOSTS"),
        (f"http://localhost:{p}/speech/three_sentences.wav", "this machine"),
        (f"http://LOCALHOST:{p}/speech/three_sentences.wav", "this machine"),
        ("http://169.254.169.254/latest/meta-data/", "this machine"),
    ):
        with pytest.raises(BadRequestError, match=says):
            await fetched(fetcher(), url)
    assert audio.asked == []


async def test_each_redirect_is_checked_again(audio: AudioServer) -> None:
    p = audio.port
    base = f"http://audio.test:{p}"
    to_speech = f"{base}/redirect?/speech/three_sentences.wav"  # relative, same host: followed
    assert (await fetched(fetcher(), to_speech))[0] == WAV
    for target, says in (
        (f"http://localhost:{p}/speech/three_sentences.wav", "this machine"),
        (f"http://127.0.0.1:{p}/speech/three_sentences.wav", "LISTEN_URL_HOSTS"),
        ("http://169.254.169.254/latest/meta-data/", "this machine"),
        ("gopher://audio.test/", "http or https"),
        ("http://xn--a.audio.test/", "not a URL"),  # malformed punycode (issue 58 §6.1)
    ):
        audio.asked.clear()
        with pytest.raises(BadRequestError, match=says):
            await fetched(fetcher(), f"{base}/redirect?{target}")
        assert [path for path, _ in audio.asked] == [f"/redirect?{target}"]
    loop = f"{base}/redirect?{base}/redirect?{base}/redirect?{base}/redirect?{base}/redirect?/"
    with pytest.raises(BadRequestError, match="redirects more than 3"):
        await fetched(fetcher(), loop)


async def test_the_size_limit_holds_with_and_without_a_length(audio: AudioServer) -> None:
    url = f"http://audio.test:{audio.port}"
    with pytest.raises(TooLargeError, match="MAX_UPLOAD_MB"):
        await fetched(fetcher(max_bytes=len(WAV) - 1), f"{url}/speech/three_sentences.wav")
    got = bytearray()

    async def write(chunk: bytes) -> None:
        got.extend(chunk)

    with pytest.raises(TooLargeError, match=r"0\.2 MB"):
        await fetcher(max_bytes=200_000).fetch(f"{url}/endless", write)
    assert 0 < len(got) <= 200_000  # streamed, and cut at the limit


async def test_upstream_failures(audio: AudioServer) -> None:
    """A 4xx is the client's URL (400); a 5xx, an unreachable port, a host that stops
    sending (read timeout) are 502; compressed content is refused."""
    url = f"http://audio.test:{audio.port}"
    with pytest.raises(BadRequestError, match="404"):
        await fetched(fetcher(), f"{url}/status/404")
    with pytest.raises(UpstreamError, match="503"):
        await fetched(fetcher(), f"{url}/status/503")
    with pytest.raises(BadRequestError, match="compressed"):
        await fetched(fetcher(), f"{url}/gzip")
    with pytest.raises(UpstreamError, match="ReadTimeout"):
        await fetched(fetcher(read_s=0.5), f"{url}/hang")
    # bytes trickling in, never 0.5 s apart: cut at the deadline scaled by size (here 1 s
    # and 1 s per 1000 bytes), not at the whole fetch's (issue 58 §6.10)
    began = time.monotonic()
    with pytest.raises(UpstreamError, match="too long"):
        await fetched(fetcher(read_s=0.5, grace_s=1.0, min_rate=1000), f"{url}/trickle")
    assert time.monotonic() - began < 30
    closed = AudioServer()
    closed.server_close()  # a port nobody listens on
    with pytest.raises(UpstreamError, match="could not be reached"):
        await fetched(fetcher(), f"http://audio.test:{closed.port}/a.wav")
    # (400; 502 where this machine's DNS server fails: then a retry may work)
    with pytest.raises((BadRequestError, UpstreamError), match="resolve"):
        await public_addresses("no-such-host.invalid", 80)
    with pytest.raises(BadRequestError, match="not a host name"):
        await fetched(UrlFetcher(("*",), 1000), "http://a..b/")


async def test_https_keeps_the_name_for_sni_and_the_certificate() -> None:
    """Connected to 127.0.0.1, the TLS handshake still names `audio.test` and the
    certificate is checked against it: a certificate for another name fails."""
    ca = trustme.CA()
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    for name, ok in (("audio.test", True), ("other.test", False)):
        server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ca.issue_cert(name).configure_cert(server_tls)
        for srv in serving(server_tls):
            url = f"https://audio.test:{srv.port}/speech/three_sentences.wav"
            if ok:
                assert (await fetched(fetcher(verify=client_tls), url))[0] == WAV
            else:
                with pytest.raises(UpstreamError, match="CERTIFICATE_VERIFY_FAILED"):
                    await fetched(fetcher(verify=client_tls), url)


# The route, through the real SDK and a real uvicorn


def environment(srv: LiveServer) -> DeepgramClientEnvironment:
    ws = srv.url.replace("http://", "ws://")
    return DeepgramClientEnvironment(base=srv.url, production=ws, agent=ws, agent_rest=srv.url)


def refusal(srv: LiveServer, url: str) -> tuple[int, dict[str, Any]]:
    client = DeepgramClient(api_key=KEY, environment=environment(srv))
    with pytest.raises(ApiError) as refused:
        client.listen.v1.media.transcribe_url(url=url, model="nova-3")
    body = refused.value.body
    assert isinstance(body, dict) and set(body) == {"err_code", "err_msg", "request_id"}, body
    assert refused.value.status_code is not None
    return refused.value.status_code, body


@pytest.fixture(scope="module")
def fetching() -> Iterator[LiveServer]:
    settings = whisper_settings(api_key=KEY, listen_url_hosts=HOSTS, max_upload_mb=0.5)
    with live_server(create_app(settings)) as srv:
        yield srv


@pytest.mark.slow
def test_url_bodies_are_refused_by_default_naming_the_setting() -> None:
    with live_server(create_app(whisper_settings(api_key=KEY))) as srv:
        status, body = refusal(srv, "https://example.org/a.wav")
        assert status == 400 and "LISTEN_URL_HOSTS" in body["err_msg"], body


@pytest.mark.slow
def test_the_route_refuses_what_the_guard_refuses(fetching: LiveServer, audio: AudioServer) -> None:
    """Fetching on, the real check: a listed name of this machine (SSRF), a listed metadata
    address, a host not listed, a bad scheme, a body that is no {"url"}; nothing asked."""
    p = audio.port
    for url, says in (
        (f"http://localhost:{p}/speech/three_sentences.wav", "this machine"),
        ("http://169.254.169.254/latest/meta-data/iam/", "this machine"),
        (f"http://127.0.0.1:{p}/speech/three_sentences.wav", "LISTEN_URL_HOSTS"),
        ("https://evil.example.com/a.wav", "LISTEN_URL_HOSTS"),
        ("ftp://audio.test/a.wav", "http or https"),
        ("http://xn--/", "not a URL"),  # malformed punycode (issue 58 §6.1) ...
        ("http://xn--a.com/", "not a URL"),
        ("http://xn--ls8h.la/", "not a URL"),  # (an emoji, which IDNA 2008 does not allow)
    ):
        status, body = refusal(fetching, url)
        assert status == 400 and body["err_code"] == "Bad Request", body
        assert says in body["err_msg"], body
    headers = {"Authorization": f"Token {KEY}", "Content-Type": "application/json"}
    deep = b"[" * 8000 + b"]" * 8000  # (a RecursionError: issue 58 §7.3)
    for raw in (b'{"uri": "x"}', b"[1]", b"{", b'{"url": 5}', deep):
        answer = httpx.post(fetching.url + "/v1/listen", content=raw, headers=headers)
        assert answer.status_code == 400 and '{"url"' in answer.json()["err_msg"], answer.text
    assert audio.asked == []


@pytest.mark.slow
def test_a_url_transcribed_through_the_route(
    fetching: LiveServer, audio: AudioServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unit level in one respect: the server's guard is told that `audio.test` is public
    (its check replaced by `told_public`); the rest is real: the SDK's transcribe_url, the
    fetch, the raw body's path (sha256 of the fetched bytes). Then a file past MAX_UPLOAD_MB
    (413), a redirect to this machine (400), a host that fails (502 REMOTE_CONTENT_ERROR)."""
    monkeypatch.setattr(fetch, "public_addresses", told_public("audio.test"))
    base = f"http://audio.test:{audio.port}"
    client = DeepgramClient(api_key=KEY, environment=environment(fetching))
    response = client.listen.v1.media.transcribe_url(
        url=f"{base}/speech/three_sentences.wav", model="nova-3", utterances=True
    )
    said = response.results.channels[0].alternatives[0].transcript
    assert wer([transcripts()["three_sentences.wav"]], [said]) <= 0.3, said
    assert response.metadata.sha256 == hashlib.sha256(WAV).hexdigest()
    status, body = refusal(fetching, f"{base}/speech/long_2min.wav")
    assert status == 413 and "MAX_UPLOAD_MB" in body["err_msg"], body
    status, body = refusal(fetching, f"{base}/redirect?http://localhost:{audio.port}/")
    assert status == 400 and "this machine" in body["err_msg"], body
    status, body = refusal(fetching, f"{base}/status/500")
    assert status == 502 and body["err_code"] == "REMOTE_CONTENT_ERROR", body
    assert not any(path == "/" for path, _ in audio.asked)


def blackhole(port: int) -> list[socket.socket]:
    """127.0.0.2:`port` listening with a full backlog: a connection to it is never
    answered (its SYN dropped) and times out, as an address that drops packets does."""
    listener = socket.socket()
    listener.bind(("127.0.0.2", port))
    listener.listen(0)
    held = [listener]
    for _ in range(4):
        client = socket.socket()
        client.setblocking(False)
        client.connect_ex(("127.0.0.2", port))
        held.append(client)
    return held


async def test_an_address_that_times_out_gives_way_to_the_next(audio: AudioServer) -> None:
    """A connect timeout (not a ConnectError in httpx) tries the name's next address."""
    held = blackhole(audio.port)
    try:

        async def vet(host: str, port: int) -> list[str]:
            return ["127.0.0.2", "127.0.0.1"]

        f = UrlFetcher(host_patterns(HOSTS), 10_000_000, vet, read_s=0.5)
        url = f"http://audio.test:{audio.port}/speech/three_sentences.wav"
        assert (await fetched(f, url))[0] == WAV
    finally:
        for sock in held:
            sock.close()


async def test_a_name_without_addresses_or_a_stuck_resolver_is_a_502(
    audio: AudioServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def nothing(host: str, port: int) -> list[str]:
        return []

    f = UrlFetcher(host_patterns(HOSTS), 1000, nothing)
    with pytest.raises(UpstreamError, match="no address"):
        await fetched(f, f"http://audio.test:{audio.port}/a.wav")
    never = asyncio.Event()

    async def stuck(*args: Any, **kwargs: Any) -> Any:
        await never.wait()

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", stuck)
    monkeypatch.setattr(fetch, "DNS_S", 0.2)
    async with asyncio.timeout(5):
        with pytest.raises(UpstreamError, match="could not be resolved within"):
            await public_addresses("audio.example.org", 80)


def test_unicode_host_patterns_match_the_urls_punycode_host() -> None:
    patterns = host_patterns("Bücher.example, *.bücher.org, xn--caf-dma.example")
    assert patterns == ("xn--bcher-kva.example", "*.xn--bcher-kva.org", "xn--caf-dma.example")
    f = UrlFetcher(patterns, 1000)
    for url in ("https://bücher.example/a.wav", "https://a.BÜCHER.org/", "https://café.example/"):
        f.checked(url)  # (not refused)
    with pytest.raises(BadRequestError, match="LISTEN_URL_HOSTS"):
        f.checked("https://bücher.org/a.wav")


async def test_the_spool_writes_and_hashes_off_the_loop_in_batches() -> None:
    """The audio (up to MAX_UPLOAD_MB) is written and hashed on a thread, a batch at a time,
    in order: never on the event loop's thread."""
    spool = prerecorded.Spool()
    threads: list[int] = []
    store = spool._store

    def recorded(data: bytes) -> None:
        threads.append(threading.get_ident())
        store(data)

    spool._store = recorded  # type: ignore[method-assign]
    chunks = [bytes([n]) * 65536 for n in range(48)]  # 3 MB in 64 KB chunks
    for chunk in chunks:
        await spool.write(chunk)
    upload, sha256 = await spool.upload("audio/wav", "empty")
    assert sha256 == hashlib.sha256(b"".join(chunks)).hexdigest()
    assert await upload.read() == b"".join(chunks)
    assert 3 <= len(threads) <= 4 and threading.get_ident() not in threads
    await upload.close()


def post_url(srv: LiveServer, url: str, timeout: float = 60) -> httpx.Response:
    headers = {"Authorization": f"Token {KEY}"}
    return httpx.post(srv.url + "/v1/listen", json={"url": url}, headers=headers, timeout=timeout)


@pytest.mark.slow
def test_a_url_is_admitted_before_a_byte_is_fetched(
    fetching: LiveServer, audio: AudioServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full queue (MAX_QUEUE) refuses a URL body before it is fetched, as it refuses an
    upload before it is decoded."""
    monkeypatch.setattr(fetch, "public_addresses", told_public("audio.test"))
    scheduler = fetching.ctx.scheduler
    held = [scheduler.admit() for _ in range(scheduler.max_queue)]
    try:
        answer = post_url(fetching, f"http://audio.test:{audio.port}/speech/three_sentences.wav")
    finally:
        for admission in held:
            admission.release()
    # Deepgram's overload: 429 TOO_MANY_REQUESTS (was 503 INTERNAL_SERVER_ERROR: issue 58 §4)
    assert answer.status_code == 429 and answer.headers["retry-after"] == "1", answer.text
    assert set(answer.json()) == {"err_code", "err_msg", "request_id"}
    assert answer.json()["err_code"] == "TOO_MANY_REQUESTS"
    assert audio.asked == []


@pytest.mark.slow
def test_a_client_that_leaves_stops_its_fetch(
    fetching: LiveServer, audio: AudioServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client gives up while the URL's host is still sending: the fetch is cancelled
    (its connection closed) at once, not at the fetch's own read timeout (30 s)."""
    monkeypatch.setattr(fetch, "public_addresses", told_public("audio.test"))
    with pytest.raises(httpx.ReadTimeout):
        post_url(fetching, f"http://audio.test:{audio.port}/hold", timeout=1.0)
    assert audio.hung_up.wait(10), "the fetch went on after its client left"


@pytest.mark.slow
def test_fetches_beyond_the_cap_are_refused_until_one_ends(
    fetching: LiveServer, audio: AudioServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At most MAX_FETCHES URLs are fetched at once; one more is a 429 to retry (as a full
    queue is), asked of nobody; once they end, fetching goes on."""
    monkeypatch.setattr(fetch, "public_addresses", told_public("audio.test"))
    hold = f"http://audio.test:{audio.port}/hold"
    with ThreadPoolExecutor(fetch.MAX_FETCHES) as pool:
        held = [pool.submit(post_url, fetching, hold) for _ in range(fetch.MAX_FETCHES)]
        deadline = 30.0
        while len(audio.asked) < fetch.MAX_FETCHES and deadline > 0:
            threading.Event().wait(0.05)
            deadline -= 0.05
        assert len(audio.asked) == fetch.MAX_FETCHES
        answer = post_url(fetching, f"http://audio.test:{audio.port}/speech/three_sentences.wav")
        assert answer.status_code == 429 and "fetched at once" in answer.json()["err_msg"]
        assert answer.json()["err_code"] == "TOO_MANY_REQUESTS" and answer.headers["retry-after"]
        assert len(audio.asked) == fetch.MAX_FETCHES
        audio.release.set()
        assert all(future.result().status_code == 502 for future in held)
    answer = post_url(fetching, f"http://audio.test:{audio.port}/speech/three_sentences.wav")
    assert answer.status_code == 200, answer.text


@pytest.mark.slow
def test_a_body_over_the_limit_is_a_deepgram_413_and_its_spool_is_closed(
    fetching: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MAX_UPLOAD_MB (0.5 here): a declared length over it, and a chunked body that grows
    past it (cut off while spooled: the spool is closed, not left to the GC)."""
    spools: list[Any] = []
    spooled = prerecorded.SpooledTemporaryFile

    def recorded(**kwargs: Any) -> Any:
        spools.append(spooled(**kwargs))
        return spools[-1]

    monkeypatch.setattr(prerecorded, "SpooledTemporaryFile", recorded)
    big = b"\0" * 2_000_000
    headers = {"Authorization": f"Token {KEY}", "Content-Type": "audio/wav"}

    def chunked() -> Iterator[bytes]:
        for n in range(0, len(big), 65536):
            yield big[n : n + 65536]

    for content in (big, chunked()):
        answer = httpx.post(fetching.url + "/v1/listen", content=content, headers=headers)
        assert answer.status_code == 413, answer.text
        body = answer.json()
        assert set(body) == {"err_code", "err_msg", "request_id"}, body
        assert body["err_code"] == "PAYLOAD_TOO_LARGE" and "MAX_UPLOAD_MB" in body["err_msg"]
    assert len(spools) == 1 and spools[0].closed
