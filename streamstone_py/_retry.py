"""Transient storage faults: which ones to retry, and how long to keep trying.

A read can always be sent again. A write can be sent again only when the
failure proves it was not applied (the connection failed before the request
went out, or the service throttled it). Any other failure of a write is
*ambiguous*: the request may have committed although no answer came. The
runners never retry those; they hand them to the verb, which resolves them by
reading the stream (see ``_operations.write``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import tenacity
from azure.core.exceptions import HttpResponseError, ServiceRequestError, ServiceResponseError

__all__ = ["RetryPolicy", "is_ambiguous", "is_transient"]

#: Statuses worth another try: timeout, throttling, and the service's own failures.
TRANSIENT_STATUSES: Final = frozenset({408, 429, 500, 502, 503, 504})
#: Of those, the ones after which a write may or may not have been applied.
AMBIGUOUS_STATUSES: Final = frozenset({408, 500, 502, 503, 504})


def is_transient(exc: BaseException) -> bool:
    """A fault that may pass: connection errors, lost responses, throttling, 5xx."""
    if isinstance(exc, ServiceRequestError | ServiceResponseError):
        return True
    return isinstance(exc, HttpResponseError) and exc.status_code in TRANSIENT_STATUSES


def is_ambiguous(exc: BaseException) -> bool:
    """A write fault after which the write may have been applied."""
    if isinstance(exc, ServiceRequestError):  # the request never left
        return False
    if isinstance(exc, ServiceResponseError):  # it left; the answer did not come back
        return True
    return isinstance(exc, HttpResponseError) and exc.status_code in AMBIGUOUS_STATUSES


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How the engine retries transient faults of one storage call.

    Exponential backoff with full jitter from ``initial_delay`` up to
    ``max_delay`` between tries; at most ``attempts`` tries and ``total_time``
    seconds per call. The same bounds apply to resolving an ambiguous write.
    ``RetryPolicy(attempts=1)`` turns retries off.
    """

    attempts: int = 6
    initial_delay: float = 0.05
    max_delay: float = 2.0
    total_time: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f"attempts must be an int >= 1, got {self.attempts!r}")
        for name in ("initial_delay", "max_delay", "total_time"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")

    def stop(self) -> tenacity.stop.stop_base:
        return tenacity.stop_after_attempt(self.attempts) | tenacity.stop_after_delay(
            self.total_time
        )

    def wait(self) -> tenacity.wait.wait_base:
        return tenacity.wait_random_exponential(multiplier=self.initial_delay, max=self.max_delay)

    def delay(self, attempt: int) -> float:
        """The pause before try ``attempt + 1`` (for retries the verbs drive)."""
        state = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})
        state.attempt_number = attempt
        return float(self.wait()(state))


#: The policy of partitions that do not name one.
DEFAULT_POLICY: Final = RetryPolicy()
