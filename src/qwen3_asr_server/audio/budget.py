"""The decoded-audio budget: seconds of 16 kHz float32 audio that requests hold at once.

Each upload reserves its duration before it is decoded (from the container header), then
grows the reservation block by block as decoding proceeds, before each block is kept: a
header that lies (or says nothing) cannot take the decoded total past the budget. A request
that would take the total past MAX_PENDING_AUDIO_SECONDS gets 503 with Retry-After instead
(413 when it alone is longer than the budget); the reservation is given back when the
request ends, however it ends.
"""

from __future__ import annotations

import threading

from ..errors import TooLargeError, UnavailableError
from .pcm import SAMPLE_RATE

RETRY_AFTER_S = 10  # long files hold the budget for a while; a tight retry loop helps nobody
BYTES_PER_SECOND = SAMPLE_RATE * 4  # float32


class AudioBudget:
    """Thread-safe: reservations grow on the decoding threads."""

    def __init__(self, limit_seconds: float) -> None:
        self.limit = limit_seconds
        self._lock = threading.Lock()
        self.in_use = 0.0  # seconds reserved now
        self.refused = 0  # requests answered 503 because of the budget

    @property
    def full(self) -> bool:
        return self.in_use >= self.limit

    def check_room(self) -> None:
        """503 before an upload is even read when the budget is spent."""
        with self._lock:
            if self.full:
                self._refuse(0.0)

    def reserve(self, seconds: float) -> Reservation:
        reservation = Reservation(self)
        reservation.grow_to(seconds)
        return reservation

    def _refuse(self, seconds: float) -> None:
        if seconds > self.limit:
            raise TooLargeError(
                f"The audio is at least {seconds:.0f} s long; the server holds at most "
                f"{self.limit:g} s of decoded audio (MAX_PENDING_AUDIO_SECONDS).",
                param="file",
            )
        self.refused += 1
        raise UnavailableError(
            f"The server is holding {self.in_use:.0f} s of decoded audio for other requests "
            f"(limit {self.limit:g} s, MAX_PENDING_AUDIO_SECONDS); retry shortly.",
            code="audio_budget_full",
            retry_after=RETRY_AFTER_S,
        )


class Reservation:
    """One request's share of the budget. `release()` may be called more than once."""

    def __init__(self, budget: AudioBudget) -> None:
        self.budget = budget
        self.seconds = 0.0
        self._released = False

    def grow_to(self, seconds: float) -> None:
        """Hold `seconds` in total, or raise 503 (413 if it could never fit) and hold
        what was held before."""
        budget = self.budget
        with budget._lock:
            if self._released:  # the request ended while its upload was still decoding
                raise UnavailableError(
                    "The request ended before its audio was decoded.", code="request_ended"
                )
            extra = seconds - self.seconds
            if extra <= 0:
                return
            if budget.in_use + extra > budget.limit:
                budget._refuse(seconds)
            budget.in_use += extra
            self.seconds = seconds

    def release(self) -> None:
        budget = self.budget
        with budget._lock:
            budget.in_use = max(0.0, budget.in_use - self.seconds)
            self.seconds = 0.0
            self._released = True
