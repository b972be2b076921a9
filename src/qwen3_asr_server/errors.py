"""Domain errors: what went wrong, in the service's words (a message, the parameter at
fault, a stable code and, for the "try again later" kinds, `retry_after` seconds). They
know nothing of HTTP: the one table that maps them to a status and OpenAI's error body is
`api/error_table.py`. No web framework here, so importing the core imports no FastAPI."""

from __future__ import annotations


class ModelLoadError(Exception):
    """A model (the engine's, the voice detector's) could not be loaded; the message says why
    and how to fix it. Raised below the service, which turns it into a 503."""


class ServiceError(Exception):
    """A failure the caller hears about. A plain ServiceError is the server's fault."""

    code: str | None = None
    retry_after: int | None = None  # seconds until trying again may succeed; None: no hint

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class BadRequestError(ServiceError):
    """The request itself is wrong (a value, a combination of values)."""


class InvalidAudioError(BadRequestError):
    """The bytes are not audio any decoder understands (`invalid_audio`, as OpenAI says)."""

    code = "invalid_audio"


class AuthError(ServiceError):
    code = "invalid_api_key"


class NotFoundError(ServiceError):
    code = "not_found"


class TooLargeError(ServiceError):
    code = "too_large"


class UnavailableError(ServiceError):
    """Not now (queue full, model loading or unavailable, shutting down): retry later."""

    def __init__(self, message: str, *, code: str, retry_after: int = 1) -> None:
        super().__init__(message, code=code)
        self.retry_after = retry_after


class QueueFullError(UnavailableError):
    def __init__(self, message: str = "The inference queue is full; retry shortly.") -> None:
        super().__init__(message, code="queue_full", retry_after=1)


class ModelUnavailableError(UnavailableError):
    def __init__(self, message: str) -> None:
        super().__init__(message, code="model_unavailable", retry_after=10)


class NotConfiguredError(ServiceError):
    """A feature this server was not set up for (e.g. translation without a backend)."""

    code = "not_configured"


class UpstreamError(ServiceError):
    """A service this one calls (e.g. the translation backend) failed."""

    code = "upstream_failed"


class RequestTimeoutError(ServiceError):
    code = "timeout"


class InferenceError(ServiceError):
    code = "inference_failed"
