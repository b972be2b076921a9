"""One engine call through the scheduler, its failures as the API's errors."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

from ..engines.base import (
    BackendUnavailableError,
    EngineBusyError,
    EngineCrashedError,
    EngineInputError,
)
from ..errors import (
    BadRequestError,
    InferenceError,
    ModelLoadError,
    ModelUnavailableError,
    ServiceError,
    UnavailableError,
)
from ..runtime.scheduler import BatchSpec, PriorityScheduler

T = TypeVar("T")


async def scheduled(
    scheduler: PriorityScheduler,
    call: Callable[[], T],
    priority: int,
    timeout: float | None,
    batch: BatchSpec | None,
    admitted: bool,
) -> T:
    """`call` on the inference thread (`PriorityScheduler.submit`); engine failures become
    API errors."""
    try:
        return await scheduler.submit(
            call, priority=priority, timeout=timeout, batch=batch, admitted=admitted
        )
    except ServiceError:  # queue full, timeout, shutting down
        raise
    except ModelLoadError as exc:  # e.g. a worker process restarted by this call
        raise ModelUnavailableError(str(exc)) from exc
    except EngineBusyError as exc:  # only partials: skipped by the session
        raise UnavailableError(str(exc), code="engine_busy") from exc
    except EngineCrashedError as exc:
        raise UnavailableError(str(exc), code="worker_exited", retry_after=1) from exc
    except BackendUnavailableError as exc:
        raise UnavailableError(
            str(exc), code="backends_unavailable", retry_after=math.ceil(exc.retry_after)
        ) from exc
    except EngineInputError as exc:  # the engine refused the input (never any bug)
        raise BadRequestError(str(exc)) from exc
    except Exception as exc:
        raise InferenceError(f"Transcription failed: {type(exc).__name__}: {exc}") from exc
