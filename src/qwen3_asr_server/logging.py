"""loguru setup: stdlib and uvicorn logs are intercepted, every line carries the request id."""

from __future__ import annotations

import contextvars
import inspect
import logging
import sys
from typing import Any

from loguru import logger

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")

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
        frame, depth = inspect.currentframe(), 0
        while frame and (depth == 0 or frame.f_code.co_filename == logging.__file__):
            frame = frame.f_back
            depth += 1
        logger.opt(depth=depth, exception=record.exc_info).log(level, record.getMessage())


def _add_request_id(record: Any) -> None:
    record["extra"].setdefault("request_id", REQUEST_ID.get())


def setup_logging(level: str = "INFO", json: bool = False) -> None:
    """Configure loguru once per process; safe to call again (it replaces the sinks)."""
    logger.remove()
    logger.configure(patcher=_add_request_id)
    if json:
        logger.add(sys.stderr, level=level.upper(), serialize=True)
    else:
        logger.add(sys.stderr, level=level.upper(), format=TEXT_FORMAT)
    std_level = logging.getLevelName(level.upper())
    if not isinstance(std_level, int):  # loguru-only names (TRACE, SUCCESS)
        std_level = logging.DEBUG
    # The stdlib filters too, so records below the level are never built and forwarded.
    logging.basicConfig(handlers=[InterceptHandler()], level=std_level, force=True)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "fastapi"):
        std = logging.getLogger(name)
        std.handlers = [InterceptHandler()]
        std.propagate = False
