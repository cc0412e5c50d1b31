"""The one vocabulary of storage errors that every runner maps into.

The verbs decide on a failed storage call by its kind, not by who sent it:

- a definite answer of the service: an ``HttpResponseError`` whose
  ``status_code`` and ``error_code`` say what happened, of azure-core's
  subclass for the status (``ResourceNotFoundError`` for 404,
  ``ResourceExistsError`` for 409, ``ResourceModifiedError`` for 412,
  ``ClientAuthenticationError`` for 401 and 403); a failed transaction is
  ``TableTransactionError`` (``RequestTooLargeError`` for 413), with the
  ``index`` of the operation that failed;
- a transport failure: ``ServiceRequestError`` (the connection could not be
  made) or ``ServiceResponseError`` (it broke after the request went out);
  :mod:`._retry` tells which of them are transient or ambiguous.

The SDK runners get these from azure-data-tables itself; the wire runners
build them here from the status, the OData error and the headers. Either
way an error names the service's request id, its status and its code, and
carries ``retry_after`` (seconds) when the service asked to wait.
"""

from __future__ import annotations

import email.utils
import re
from datetime import UTC, datetime
from typing import Any, Final

from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import RequestTooLargeError, TableTransactionError

__all__ = ["error_code", "retry_after", "service_error", "table_missing"]

_BY_STATUS: Final[dict[int, type[HttpResponseError]]] = {
    401: ClientAuthenticationError,
    403: ClientAuthenticationError,
    404: ResourceNotFoundError,
    409: ResourceExistsError,
    412: ResourceModifiedError,
}
#: The index a transaction's error message starts with: ``"1:The specified..."``.
_INDEX: Final = re.compile(r"(\d+):")


def service_error(
    status: int,
    reason: str,
    code: str | None,
    message: str | None,
    request_id: str | None,
    *,
    transaction: bool = False,
    retry_after: float | None = None,
) -> HttpResponseError:
    """The error of a definite answer, of the type the SDK would raise for it."""
    text = (message or reason or "").strip()
    index = 0
    if transaction:
        found = _INDEX.match(text)
        index = int(found.group(1)) if found else 0
    summary = f"{text}\nStatus: {status} {reason}\nErrorCode: {code}\nRequestId: {request_id}"
    error: HttpResponseError
    if transaction:
        kind = RequestTooLargeError if status == 413 else TableTransactionError
        error = kind(message=summary, index=index)
    else:
        error = _BY_STATUS.get(status, HttpResponseError)(message=summary)
    error.status_code = status
    error.reason = reason
    error.error_code = code  # type: ignore[attr-defined]  # as azure-data-tables sets it
    error.request_id = request_id  # type: ignore[attr-defined]
    error.retry_after = retry_after  # type: ignore[attr-defined]
    return error


def error_code(exc: BaseException) -> str | None:
    """The service's error code (``EntityAlreadyExists``...), whatever form the SDK gives it."""
    code = getattr(exc, "error_code", None)
    code = getattr(code, "value", code)
    return str(code) if code else None


def table_missing(exc: BaseException) -> bool:
    """A missing table is an error to report, not a missing stream."""
    return error_code(exc) == "TableNotFound"


#: The longest wait a ``Retry-After`` is taken for: the service asks for
#: seconds; a larger value (a broken proxy's) is taken as this.
MAX_RETRY_AFTER: Final = 3600.0
#: Delta-seconds as HTTP writes them: ASCII digits only (not "1e3", "inf",
#: "1_000" nor digits of other scripts, all of which float() and int() take).
_DELTA_SECONDS: Final = re.compile(r"[0-9]+", re.ASCII)


def retry_after(exc: BaseException) -> float | None:
    """Seconds the service asked to wait (``Retry-After``), if it did, at most
    :data:`MAX_RETRY_AFTER`."""
    seconds = getattr(exc, "retry_after", None)
    if isinstance(seconds, int | float) and not isinstance(seconds, bool):
        return min(float(seconds), MAX_RETRY_AFTER) if seconds >= 0 else None  # NaN: None
    response: Any = getattr(exc, "response", None) if isinstance(exc, AzureError) else None
    headers = getattr(response, "headers", None)
    value = headers.get("Retry-After") if headers is not None else None
    return parse_retry_after(value)


def parse_retry_after(value: object) -> float | None:
    """``Retry-After`` as seconds from now, at most :data:`MAX_RETRY_AFTER`, or
    None: HTTP allows delta-seconds (what the service sends) and an HTTP date
    (what a proxy or gateway may); anything else is no ``Retry-After``."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    if _DELTA_SECONDS.fullmatch(text):
        # Long runs of digits are not parsed (int() refuses over 4,300 of them).
        return MAX_RETRY_AFTER if len(text) > 9 else min(float(text), MAX_RETRY_AFTER)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # "-0000": an HTTP date is in GMT
        when = when.replace(tzinfo=UTC)
    return min(max((when - datetime.now(UTC)).total_seconds(), 0.0), MAX_RETRY_AFTER)
