"""Credentials out of what is shown: URLs in /health, /metrics, logs and error messages."""

from __future__ import annotations


def redact_url(url: str) -> str:
    """`url` as it may be shown (/health, /metrics, logs, error messages): the password in
    its userinfo replaced by `***` (`http://user:***@host/v1`); a userinfo without a
    password (it may be a token) is `***` as a whole."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    userinfo, at, host = rest[:end].rpartition("@")
    if not at:
        return url
    user, colon, _ = userinfo.partition(":")
    shown = f"{user}:***" if colon else "***"
    return f"{scheme}{sep}{shown}@{host}{rest[end:]}"
