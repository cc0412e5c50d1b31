"""Transient storage faults: which ones to retry, and how long to keep trying.

A read can always be sent again. A write can be sent again only when the
failure proves it was not applied (no connection could be made, or the
service throttled it). Any other failure of a write is *ambiguous*: the
request may have committed although no answer came. The runners never retry
those; they hand them to the verb, which resolves them by reading the stream
(see ``_attempts.attempt``).

Every way a transport fails maps to one of three kinds, for both clients:

- *not sent*: the connection could not be made (refused, unreachable, a
  connect timeout): a ``ServiceRequestError`` whose cause says so. Transient.
- *ambiguous*: anything after the connection was made: a dropped connection
  (aiohttp reports it as a ``ServiceRequestError`` too), a lost or cut
  response (``ServiceResponseError``, ``IncompleteReadError``, or a
  ``requests``/``urllib3``/``aiohttp`` error that escapes the SDK, which the
  runners turn into a ``ServiceResponseError``), a read timeout, 408 and 5xx.
  Transient for reads; resolved by reading for writes.
- *definite*: any other answer of the service.
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final, NoReturn, TypeVar

import tenacity
from azure.core.exceptions import (
    AzureError,
    DecodeError,
    HttpResponseError,
    IncompleteReadError,
    ServiceRequestError,
    ServiceResponseError,
)

from ._faults import retry_after

__all__ = [
    "TRANSPORT_ERRORS",
    "RetryPolicy",
    "as_service_error",
    "is_ambiguous",
    "is_transient",
    "masked_sdk_error",
    "proves_not_sent",
    "raise_as_storage_error",
    "sdk_call_error",
]


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The base classes of what the transports raise below the SDK."""
    found: list[type[BaseException]] = [
        http.client.HTTPException,
        asyncio.IncompleteReadError,
        ConnectionError,
    ]
    try:
        import requests
        import urllib3

        found += [requests.exceptions.RequestException, urllib3.exceptions.HTTPError]
    except ImportError:  # pragma: no cover - azure-core depends on requests
        pass
    try:
        import aiohttp

        found.append(aiohttp.ClientError)
    except ImportError:  # pragma: no cover - aiohttp is a dependency of the async client
        pass
    return tuple(found)


#: Transport failures that can escape the SDK (a response cut mid-body, say).
TRANSPORT_ERRORS: Final = _transport_errors()

#: Names of the causes that prove no connection was made, so nothing was sent.
_NOT_CONNECTED: Final = frozenset(
    {
        "ClientConnectorError",  # aiohttp: could not connect
        "NewConnectionError",  # urllib3: could not connect
        "ConnectTimeoutError",  # urllib3
        "ConnectTimeout",  # requests
        "ConnectionRefusedError",
        "TokenTimeoutError",  # _auth: no bearer token in time, so no request
    }
)


def _causes(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    queue: list[BaseException | None] = [exc]
    while queue:
        current = queue.pop()
        if current is None or any(current is s for s in seen):
            continue
        seen.append(current)
        inner = getattr(current, "inner_exception", None)
        reason = getattr(current, "reason", None)
        queue += [
            current.__cause__,
            current.__context__,
            inner if isinstance(inner, BaseException) else None,
            reason if isinstance(reason, BaseException) else None,
            *(a for a in current.args if isinstance(a, BaseException)),
        ]
    return seen


def proves_not_sent(exc: BaseException) -> bool:
    """True if the failure shows that no connection was made for the request."""
    return any(
        any(cls.__name__ in _NOT_CONNECTED for cls in type(cause).__mro__) for cause in _causes(exc)
    )


def as_service_error(exc: BaseException) -> ServiceRequestError | ServiceResponseError:
    """A transport failure that escaped the SDK, as the SDK's own error of its kind."""
    if proves_not_sent(exc):
        return ServiceRequestError(f"no connection: {exc!r}", error=exc)
    return ServiceResponseError(f"the connection broke during the request: {exc!r}", error=exc)


def masked_sdk_error(exc: BaseException) -> AzureError | None:
    """The SDK's own error that its error handling failed on, if ``exc`` is that.

    azure-data-tables decodes a failed call's response to name its error; a
    response cut before its body leaves none, and the decoding raises
    ``AttributeError`` from inside the SDK, the real error (a cut response:
    ambiguous) as its context. That error is the one to act on.
    """
    if not isinstance(exc, AttributeError | TypeError):
        return None
    context = exc.__context__
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    inside_sdk = tb is not None and "azure" in Path(tb.tb_frame.f_code.co_filename).parts
    return context if inside_sdk and isinstance(context, AzureError) else None


def sdk_call_error(exc: Exception) -> AzureError | None:
    """What a failed SDK call means in the runners' terms: the SDK's error, a
    transport error that escaped the SDK as one, or ``None`` (not a storage fault)."""
    if isinstance(exc, AzureError):
        return exc
    if isinstance(exc, TRANSPORT_ERRORS):  # escaped the SDK, e.g. a response cut mid-body
        return as_service_error(exc)
    return masked_sdk_error(exc)


def raise_as_storage_error(exc: Exception) -> NoReturn:
    """Raise what a failed SDK call means for the runners (see :func:`sdk_call_error`)."""
    error = sdk_call_error(exc)
    if error is None or error is exc:
        raise exc
    raise error from (None if error is exc.__context__ else exc)


#: Statuses worth another try: timeout, throttling, and the service's own failures.
TRANSIENT_STATUSES: Final = frozenset({408, 429, 500, 502, 503, 504})
#: Of those, the ones after which a write may or may not have been applied.
AMBIGUOUS_STATUSES: Final = frozenset({408, 500, 502, 503, 504})


def _cut_response(exc: BaseException) -> bool:
    """A response that arrived incomplete or unreadable: the request was served."""
    return isinstance(exc, IncompleteReadError | DecodeError)


def is_transient(exc: BaseException) -> bool:
    """A fault that may pass: connection errors, lost or cut responses, throttling, 5xx."""
    if isinstance(exc, ServiceRequestError | ServiceResponseError) or _cut_response(exc):
        return True
    return isinstance(exc, HttpResponseError) and exc.status_code in TRANSIENT_STATUSES


def is_ambiguous(exc: BaseException) -> bool:
    """A write fault after which the write may have been applied.

    Only a failure that proves no connection was made counts as not sent:
    aiohttp reports a connection the server closed after applying the request
    as a ``ServiceRequestError`` too.
    """
    if isinstance(exc, ServiceRequestError):
        return not proves_not_sent(exc)
    if isinstance(exc, ServiceResponseError) or _cut_response(exc):
        return True
    return isinstance(exc, HttpResponseError) and exc.status_code in AMBIGUOUS_STATUSES


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How the engine retries the transient faults of one verb call.

    ``total_time`` is the deadline of the whole call (a ``Stream.write``, a
    ``Stream.read``...): of every storage request it makes, every retry and
    every pause between them, a lost write's resolution included. Each try's
    connect and read timeouts are the time left, at least
    :data:`._protocol.MIN_TIMEOUT` (a request the call must still make once
    the deadline has passed gets one try of that), so a server that never
    answers fails the call after about ``total_time``. Between tries: exponential
    backoff with full jitter from ``initial_delay`` up to ``max_delay``, and
    at least what the service asked (``Retry-After``); a pause that would end
    past the deadline is not taken, and the call ends at once with the error
    it had, which says so. At most ``attempts`` tries of each request, and
    of a write the verb sends again after reading that it was not applied.
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
            if (
                not isinstance(value, int | float)
                or isinstance(value, bool)
                or not 0 <= value < math.inf
            ):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    def stop(self, deadline: float) -> tenacity.stop.stop_base:
        """Stop after ``attempts`` tries, or before a pause that would end past
        ``deadline`` (``time.monotonic()`` clock)."""
        return tenacity.stop_after_attempt(self.attempts) | _Past(deadline)

    def wait(self) -> tenacity.wait.wait_base:
        """Backoff with full jitter, and at least what the service asked
        (``Retry-After`` of a 429 or 503)."""
        return _Wait(self)

    def deadline(self) -> float:
        """When a call that starts now must be over (``time.monotonic()`` clock)."""
        return time.monotonic() + self.total_time

    def delay(self, attempt: int) -> float:
        """The pause before try ``attempt + 1`` (for retries the verbs drive)."""
        state = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})
        state.attempt_number = attempt
        return float(self.wait()(state))


class _Past(tenacity.stop.stop_base):
    """Stop before a pause that would end past the call's deadline."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return time.monotonic() + (retry_state.upcoming_sleep or 0.0) >= self.deadline


class _Wait(tenacity.wait.wait_base):
    def __init__(self, policy: RetryPolicy) -> None:
        self.backoff = tenacity.wait_random_exponential(
            multiplier=policy.initial_delay, max=policy.max_delay
        )

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        seconds = float(self.backoff(retry_state))
        outcome = retry_state.outcome
        error = outcome.exception() if outcome is not None else None
        asked = retry_after(error) if error is not None else None
        return seconds if asked is None else max(seconds, asked)


E = TypeVar("E", bound=BaseException)

#: Says why a call ended before its tries were spent (WARNING records).
log: Final = logging.getLogger("streamstone_py")


def out_of_time(error: E, where: object, policy: RetryPolicy, deadline: float) -> E:
    """``error``, which ends the call at ``where`` because no time is left to
    try again: noted on the error, and logged."""
    asked = retry_after(error)
    if asked is not None and time.monotonic() + asked >= deadline:
        why = f"the service asked to wait {asked:g} s (Retry-After)"
    else:
        why = "another try would start"
    reason = f"{why}, past the call's deadline (total_time={policy.total_time:g} s)"
    error.add_note(f"streamstone_py did not try again: {reason}")
    log.warning("%s: %s, not tried again: %s", where, type(error).__name__, reason)
    return error


#: The policy of partitions that do not name one.
DEFAULT_POLICY: Final = RetryPolicy()
