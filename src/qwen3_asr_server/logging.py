"""loguru setup: stdlib and uvicorn logs are intercepted, every line carries the request id,
and no line carries a secret (nor does a URL shown anywhere: `redact_url`)."""

from __future__ import annotations

import contextvars
import inspect
import logging
import re
import sys
from typing import Any
from urllib.parse import unquote_plus

from loguru import logger

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
# Set by a WebSocket route that refused its handshake with an HTTP response (the denial
# extension): uvicorn 0.54's websockets-sansio then logs an ERROR although the response went
# out (Kludex/uvicorn#3138); that one line is logged at DEBUG for such a connection.
HANDSHAKE_DENIED: contextvars.ContextVar[bool] = contextvars.ContextVar("denied", default=False)
DENIAL_NOISE = "ASGI callable returned without completing handshake."

# Where a key shows up in what libraries log: a WebSocket URL's `?api_key=` (uvicorn prints
# paths with their query string, undecoded: `?%61pi_key=` is the same parameter), the
# `Authorization` header and the browsers' key subprotocols, OpenAI's and Deepgram's
# `token, <key>` (websockets prints the handshake headers at DEBUG).
SECRETS = re.compile(
    r"(?i)(?P<keep>(?<![\w%])(?:[a-z0-9_.~-]|%[0-9a-f]{2})+=|authorization:\s*(?:\w+\s+)?"
    r"|openai-insecure-api-key\.|sec-websocket-protocol:\s*token,\s*)[^\s&,;\"'<>]+"
)
KEY_PARAMS = {"api_key", "api-key"}
MAX_LINE_CHARS = 2000  # a log message's length (its traceback, if any, is not counted)


def _hide(match: re.Match[str]) -> str:
    keep = match["keep"]
    if keep.endswith("=") and unquote_plus(keep[:-1]).lower() not in KEY_PARAMS:
        return keep + redact(match[0][len(keep) :])  # another parameter: its value is checked
    return keep + "***"


TEXT_FORMAT = (
    "<green>{time:YYYY-MM-DD HH:mm:ss.SSS}</green> | <level>{level: <7}</level> | "
    "<cyan>{extra[request_id]}</cyan> | {name}:{line} - <level>{message}</level>"
)


class InterceptHandler(logging.Handler):
    """Send stdlib log records to loguru, keeping the caller's location."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level: str | int = logger.level(record.levelname).name
        except ValueError:
            level = record.levelno
        if HANDSHAKE_DENIED.get() and record.getMessage() == DENIAL_NOISE:
            level = "DEBUG"
        frame, depth = inspect.currentframe(), 0
        while frame and (depth == 0 or frame.f_code.co_filename == logging.__file__):
            frame = frame.f_back
            depth += 1
        logger.opt(depth=depth, exception=record.exc_info).log(level, record.getMessage())


def redact(text: str) -> str:
    """`text` with every API key it carries replaced by `***`."""
    return SECRETS.sub(_hide, text)


def _patch(record: Any) -> None:
    record["extra"].setdefault("request_id", REQUEST_ID.get())
    message = redact(record["message"])
    if len(message) > MAX_LINE_CHARS:  # user input echoed (a path, a language) is bounded
        message = f"{message[:MAX_LINE_CHARS]}... ({len(message) - MAX_LINE_CHARS} more characters)"
    record["message"] = message


def setup_logging(level: str = "INFO", json: bool = False) -> None:
    """Configure loguru once per process; safe to call again (it replaces the sinks)."""
    logger.remove()
    logger.configure(patcher=_patch)  # every sink, including ones added later (tests)
    # diagnose=False: tracebacks do not print local variables (client messages, keys).
    if json:
        logger.add(sys.stderr, level=level.upper(), serialize=True, diagnose=False)
    else:
        logger.add(sys.stderr, level=level.upper(), format=TEXT_FORMAT, diagnose=False)
    std_level = logging.getLevelName(level.upper())
    if not isinstance(std_level, int):  # loguru-only names (TRACE, SUCCESS)
        std_level = logging.DEBUG
    # The stdlib filters too, so records below the level are never built and forwarded.
    logging.basicConfig(handlers=[InterceptHandler()], level=std_level, force=True)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "fastapi"):
        std = logging.getLogger(name)
        std.handlers = [InterceptHandler()]
        std.propagate = False
    # httpx logs every request at INFO (the remote engine makes one per job): DEBUG is enough.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(max(std_level, logging.WARNING))


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
