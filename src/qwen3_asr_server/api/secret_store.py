"""Client secrets (`ek_…`): short-lived keys that open the /v1/realtime WebSocket only, so a
browser can connect without holding API_KEY. Minted by POST /v1/realtime/client_secrets
(api/openai/client_secrets.py); checked by the WebSocket key check (api/live/common.py).

Kept in memory, one store per app (built in the lifespan), bounded: at most `capacity` live
secrets; expired ones are purged when a new one is minted and when one is looked up. Only
a SHA-256 digest of each secret is kept, so the store never holds a usable key and a lookup
compares digests, not the secret itself."""

from __future__ import annotations

import hashlib
import math
import secrets
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from ..errors import UnavailableError

PREFIX = "ek_"
MAX_LIVE_SECRETS = 10_000  # a few hundred bytes each: bounded at a few MB
REALTIME_PATH = "/v1/realtime"  # the only route a client secret opens
SCOPE_KEY = "qwen3_asr_server.client_secret"  # where the WebSocket check keeps a granted one


@dataclass(frozen=True)
class ClientSecret:
    """What a secret grants: the /v1/realtime WebSocket until `expires_at` (epoch seconds),
    and the session config it was minted with (`session`, as echoed on minting)."""

    expires_at: int
    session: dict[str, Any]


def granted_secret(scope: MutableMapping[str, Any]) -> ClientSecret | None:
    """The client secret a /v1/realtime connection was opened with (its session config is
    that session's defaults), or None (API_KEY, or no key at all)."""
    found = scope.get(SCOPE_KEY)
    return found if isinstance(found, ClientSecret) else None


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()


class ClientSecretStore:
    """The live client secrets of one server. `clock` (epoch seconds) is injectable so
    tests can expire a secret without sleeping."""

    def __init__(
        self, capacity: int = MAX_LIVE_SECRETS, clock: Callable[[], float] = time.time
    ) -> None:
        self.capacity = capacity
        self.clock = clock
        self._secrets: dict[bytes, ClientSecret] = {}

    def __len__(self) -> int:
        return len(self._secrets)

    def mint(self, seconds: int, session: dict[str, Any]) -> tuple[str, ClientSecret]:
        """A new secret valid for `seconds` from now: (its value, what it grants). Raises
        UnavailableError (503, Retry-After: when the first live one expires) at capacity."""
        now = self.clock()
        self.purge(now)
        if len(self._secrets) >= self.capacity:
            first = min(s.expires_at for s in self._secrets.values())
            raise UnavailableError(
                f"Too many live client secrets (at most {self.capacity}); retry when one "
                "expires, or mint them with a shorter expires_after.",
                code="too_many_client_secrets",
                retry_after=max(1, math.ceil(first - now)),
            )
        value = PREFIX + secrets.token_urlsafe(32)
        granted = ClientSecret(expires_at=int(now) + seconds, session=session)
        self._secrets[_digest(value)] = granted
        return value, granted

    def lookup(self, value: str) -> ClientSecret | None:
        """The secret `value` names if it is live; None if unknown or expired."""
        if not value.startswith(PREFIX):
            return None
        key = _digest(value)
        found = self._secrets.get(key)
        if found is None:
            return None
        if self.clock() >= found.expires_at:
            del self._secrets[key]
            return None
        return found

    def purge(self, now: float | None = None) -> None:
        """Forget every expired secret."""
        now = self.clock() if now is None else now
        for key in [k for k, s in self._secrets.items() if now >= s.expires_at]:
            del self._secrets[key]
