"""POST /v1/listen's JSON body (`{"url": ...}`): the audio fetched from a host the operator
allowed (LISTEN_URL_HOSTS), never from this machine's own networks (SSRF). Settings-free:
the route gives it the hosts and MAX_UPLOAD_MB's byte limit (docs/DEEPGRAM.md).

Every hop (the URL, then each redirect, at most MAX_REDIRECTS) is checked before it is
asked: http or https, its host on the list, every address its name resolves to a public one
(the name resolved off the event loop). The connection then goes to an address that was
checked: the URL's host is replaced by it, while `Host`, TLS's SNI and the certificate check
stay on the name, so a second DNS answer cannot send it elsewhere (DNS rebinding). No proxy
from the environment is used (it would resolve the name itself). The body is streamed and
cut at the limit. Refusals are 400 (413 past the size limit); a host that cannot be reached,
times out or answers 5xx is 502 (UpstreamError). `Fetches` is one app's share: its patterns,
at most MAX_FETCHES fetches at once (503 beyond, as a full queue) and one TLS context."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import idna

from ...errors import BadRequestError, TooLargeError, UnavailableError, UpstreamError

MAX_REDIRECTS = 3
CONNECT_S, READ_S = 10.0, 30.0  # to connect; then each read (the longest wait between bytes)
DEADLINE_S = 300.0  # the whole fetch, every hop and the body
# ... and, scaled by size: past GRACE_S, at least MIN_RATE bytes a second on average (a host
# trickling bytes cannot hold one of the MAX_FETCHES slots for DEADLINE_S)
GRACE_S, MIN_RATE = 15.0, 100_000
DNS_S = 10.0  # to resolve a name (a stuck resolver does not hold the request)
MAX_FETCHES = 4  # URL fetches in progress at once, per app
NAT64 = ipaddress.ip_network("64:ff9b::/96")  # IPv6 addresses carrying an IPv4 one
# not public, though Python 3.11 calls them global: site-local (deprecated, still routed
# inside some sites) and the documentation prefix of RFC 9637
NOT_PUBLIC_V6 = (ipaddress.ip_network("fec0::/10"), ipaddress.ip_network("3fff::/20"))
IP = ipaddress.IPv4Address | ipaddress.IPv6Address
# (host, port) -> the addresses to connect to, each one checked; or a refusal
Vet = Callable[[str, int], Awaitable[list[str]]]
Write = Callable[[bytes], Awaitable[None]]  # where the body goes, chunk by chunk, in order


def host_patterns(setting: str | None) -> tuple[str, ...]:
    """LISTEN_URL_HOSTS as patterns: `host.org` (that name), `*.host.org` (its subdomains,
    at any depth, not the name itself), `*` (any host; the address check still holds). A
    Unicode name is kept as its IDNA (punycode) form, the form a URL's host is checked in."""
    items = (h.strip().lower().rstrip(".") for h in (setting or "").split(","))
    return tuple(ascii_pattern(h) for h in items if h)


def ascii_pattern(pattern: str) -> str:
    star, name = ("*.", pattern[2:]) if pattern.startswith("*.") else ("", pattern)
    if name.isascii():
        return pattern
    try:  # (as httpx encodes a URL's host)
        return star + idna.encode(name).decode("ascii")
    except idna.IDNAError:
        return pattern  # (matches no host)


def host_allowed(host: str, patterns: tuple[str, ...]) -> bool:
    host = host.lower().rstrip(".")
    return any(
        p == "*" or p == host or (p.startswith("*.") and host.endswith(p[1:])) for p in patterns
    )


def is_public(ip: IP) -> bool:
    """A globally routable unicast address: not loopback, private, shared (CGNAT),
    link-local (169.254.169.254, the clouds' metadata service), multicast, reserved,
    unspecified, documentation; an IPv6 address carrying an IPv4 one (mapped, 6to4, NAT64)
    is judged by that IPv4 address."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = ip.ipv4_mapped or ip.sixtofour
        if inner is None and ip in NAT64:
            inner = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if inner is not None:
            return is_public(inner)
        if any(ip in net for net in NOT_PUBLIC_V6):
            return False
    flags = (ip.is_private, ip.is_loopback, ip.is_link_local, ip.is_multicast, ip.is_reserved)
    return ip.is_global and not ip.is_unspecified and not any(flags)


async def public_addresses(host: str, port: int) -> list[str]:
    """Every address `host` resolves to, if all are public; else a refusal."""
    loop = asyncio.get_running_loop()
    try:  # the loop's getaddrinfo runs in its default executor, off the event loop
        async with asyncio.timeout(DNS_S):
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except TimeoutError as exc:
        message = f"The URL's host {host} could not be resolved within {DNS_S:g} s."
        raise UpstreamError(message, param="url") from exc
    except socket.gaierror as exc:
        if exc.errno == socket.EAI_AGAIN:  # a DNS server failed: worth a retry
            raise UpstreamError(
                f"The URL's host {host} could not be resolved now.", param="url"
            ) from exc
        raise BadRequestError(f"The URL's host {host} does not resolve.", param="url") from exc
    except UnicodeError as exc:  # a name no resolver takes (an empty or over-long label)
        raise BadRequestError(f"The URL's host {host} is not a host name.", param="url") from exc
    found = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    for ip in found:
        if not is_public(ip):
            raise BadRequestError(
                f"The URL's host {host} resolves to {ip}, an address of this machine or its "
                "own networks (loopback, private, link-local, ...): not fetched.",
                param="url",
            )
    return list(dict.fromkeys(str(ip) for ip in found))


@dataclass(frozen=True)
class UrlFetcher:
    hosts: tuple[str, ...]  # host_patterns(LISTEN_URL_HOSTS)
    max_bytes: int
    vet: Vet | None = None  # None: public_addresses (tests: a local server, told public)
    verify: ssl.SSLContext | bool = True  # a context is used as it is (`Fetches.tls`)
    read_s: float = READ_S
    deadline_s: float = DEADLINE_S
    grace_s: float = GRACE_S
    min_rate: float = MIN_RATE  # bytes a second, on average past grace_s

    def checked(self, link: str, base: httpx.URL | None = None) -> httpx.URL:
        """`link` (relative to `base`, a redirect's) if its scheme and host may be asked (its
        addresses are checked as it is asked)."""
        try:
            url = base.join(link) if base is not None else httpx.URL(link)
            named = bool(url.host)  # (decodes an IDNA host: malformed punycode raises)
        except (httpx.InvalidURL, TypeError, ValueError) as exc:
            raise BadRequestError(f"The url is not a URL ({exc}).", param="url") from exc
        if url.scheme not in ("http", "https") or not named:
            raise BadRequestError("The url must be an http or https URL.", param="url")
        host = url.raw_host.decode("ascii")
        if not host_allowed(host, self.hosts):
            raise BadRequestError(
                f"The URL's host {host} is not one this server fetches from (LISTEN_URL_HOSTS).",
                param="url",
            )
        return url

    async def fetch(self, url: str, write: Write) -> str:
        """The body of `url` (redirects followed, each hop checked) given to `write` chunk by
        chunk, at most `max_bytes`; its content type."""
        target = self.checked(url)
        tls = self.verify
        if not isinstance(tls, ssl.SSLContext):  # (CPU and disk work: off the event loop)
            tls = await asyncio.to_thread(httpx.create_ssl_context, tls)
        try:
            async with asyncio.timeout(self.deadline_s) as budget:
                for _ in range(MAX_REDIRECTS + 1):
                    async with self._response(target, tls) as response:
                        if not response.is_redirect:
                            return await self._read(response, write, budget)
                        target = self.checked(response.headers["location"], target)
        except TimeoutError as exc:
            raise UpstreamError(
                f"The URL took too long: at most {self.deadline_s:g} s, and past the first "
                f"{self.grace_s:g} s at least {self.min_rate / 1000:g} kB a second.",
                param="url",
            ) from exc
        raise BadRequestError(f"The URL redirects more than {MAX_REDIRECTS} times.", param="url")

    @asynccontextmanager
    async def _response(self, url: httpx.URL, tls: ssl.SSLContext) -> AsyncIterator[httpx.Response]:
        """`url` asked at one of its checked addresses (the next if one cannot be reached),
        in a client of its own (no connection shared across names)."""
        host = url.raw_host.decode("ascii")
        port = url.port or (443 if url.scheme == "https" else 80)
        addresses = await (self.vet or public_addresses)(host, port)
        if not addresses:
            raise UpstreamError(f"The URL's host {host} has no address.", param="url")
        headers = {"Host": url.netloc.decode("ascii"), "Accept-Encoding": "identity"}
        timeout = httpx.Timeout(self.read_s, connect=min(CONNECT_S, self.read_s))
        for n, address in enumerate(addresses):
            pinned, sni = url.copy_with(host=address), {"sni_hostname": host}
            async with httpx.AsyncClient(verify=tls, timeout=timeout, trust_env=False) as client:
                request = client.build_request("GET", pinned, headers=headers, extensions=sni)
                try:
                    response = await client.send(request, stream=True)
                except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                    if n + 1 < len(addresses):
                        continue  # the name's next address
                    message = f"The URL's host {host} could not be reached ({exc})."
                    raise UpstreamError(message, param="url") from exc
                except httpx.HTTPError as exc:
                    message = f"The URL's host {host} failed: {exc!r}."
                    raise UpstreamError(message, param="url") from exc
                except ValueError as exc:  # (a redirect to a malformed IDNA name: httpx reads it)
                    message = f"The url is not a URL: it redirects to a malformed name ({exc})."
                    raise BadRequestError(message, param="url") from exc
                try:
                    yield response
                finally:
                    await response.aclose()
                return

    async def _read(self, response: httpx.Response, write: Write, budget: asyncio.Timeout) -> str:
        status = f"{response.status_code} {response.reason_phrase}".strip()
        if response.status_code >= 500:
            raise UpstreamError(f"The URL's host answered {status}.", param="url")
        if not response.is_success:
            raise BadRequestError(f"The URL's host answered {status}.", param="url")
        coding = response.headers.get("content-encoding", "identity").lower()
        if coding != "identity":
            raise BadRequestError(f"The URL's content is compressed ({coding}).", param="url")
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_bytes:
            raise self._too_large()
        size = 0
        due = budget.when()
        start = (due or 0.0) - self.deadline_s

        def by_size() -> None:  # (the deadline, scaled by the bytes received so far)
            if due is not None:
                budget.reschedule(min(due, start + self.grace_s + size / self.min_rate))

        by_size()
        try:
            async for chunk in response.aiter_raw():
                size += len(chunk)
                by_size()
                if size > self.max_bytes:
                    raise self._too_large()
                await write(chunk)
        except httpx.HTTPError as exc:
            raise UpstreamError(f"Reading the URL failed: {exc!r}.", param="url") from exc
        return str(response.headers.get("content-type") or "application/octet-stream")

    def _too_large(self) -> TooLargeError:
        mb = self.max_bytes / 1_000_000
        return TooLargeError(
            f"The URL's content is larger than the {mb:g} MB limit (MAX_UPLOAD_MB).", param="url"
        )


class Fetches:
    """One app's URL fetching (on its AppContext): its host patterns, at most `slots` fetches at
    once (beyond them a 503 to retry, as a full queue is), the TLS context built once."""

    def __init__(self, hosts: tuple[str, ...], slots: int = MAX_FETCHES) -> None:
        self.hosts = hosts
        self._slots = asyncio.Semaphore(slots)
        self._tls: ssl.SSLContext | None = None

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        if self._slots.locked():
            raise UnavailableError(
                "Too many URLs are being fetched at once; retry shortly.", code="fetches_full"
            )
        async with self._slots:
            yield

    async def tls(self) -> ssl.SSLContext:
        """The certificate store, loaded once (CPU and disk work: off the event loop)."""
        if self._tls is None:
            self._tls = await asyncio.to_thread(httpx.create_ssl_context)
        return self._tls
