"""A client span per storage request, the same whichever runner performs it.

Both runners wrap each try of a request in :func:`attempt` (sync) or
:func:`attempt_async`, so the span is made here alone: the verbs never see
it, and the wire and the SDK runner give the same spans. What a span holds
follows OpenTelemetry's conventions for database and HTTP clients; what the
answer tells (its status, the service's request id) is noted by the runner's
I/O through :func:`answered` on the span that is current while it runs.

Nothing secret goes in: the table's name, the account's host and port, and
the service's answer, never a URL's query (a SAS token), a key or a token.
Without an OpenTelemetry SDK installed, each span is the API's no-op.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, StatusCode

from . import _metrics
from ._faults import error_code
from ._protocol import (
    CreateEntity,
    GetEntity,
    QueryEntities,
    QueryPage,
    Request,
    SubmitTransaction,
    UpdateEntity,
)

__all__ = ["answered", "attempt", "attempt_async", "sdk_hook"]

T = TypeVar("T")

#: The instrumentation scope of the engine's spans.
SCOPE: Final = "streamstone_py"
#: No well-known ``db.system.name`` names Azure Table Storage: ours, in the
#: form of the conventions' others (``azure.cosmosdb``).
SYSTEM: Final = "azure.tables"

#: Each request by the name of the azure-data-tables method that sends it, so
#: a team that traced the SDK finds the operations it knows.
_OPERATIONS: Final[Mapping[type, str]] = {
    GetEntity: "get_entity",
    QueryEntities: "query_entities",
    QueryPage: "query_entities",
    CreateEntity: "create_entity",
    UpdateEntity: "update_entity",
    SubmitTransaction: "submit_transaction",
}

#: The status of the answer to the try in progress (its last page's, for a
#: query read whole), noted by :func:`answered` for the duration metric,
#: which is recorded whether or not the span records.
_STATUS: ContextVar[list[int | None] | None] = ContextVar("streamstone_status", default=None)


def _where(table: object) -> dict[str, Any]:
    """What a span tells of the table: its name, the account and the host,
    taken from the client's URL without its query (where a SAS would be)."""
    parts = urlsplit(str(getattr(table, "url", "")))
    attributes: dict[str, Any] = {"db.system.name": SYSTEM}
    name = getattr(table, "table_name", None)
    if isinstance(name, str):
        attributes["db.collection.name"] = name
    account = getattr(table, "account_name", None)
    if isinstance(account, str):
        attributes["db.namespace"] = account
    if parts.hostname:
        attributes["server.address"] = parts.hostname
        attributes["server.port"] = parts.port or (443 if parts.scheme == "https" else 80)
    return attributes


@contextmanager
def _span(table: object, request: Request, resent: int) -> Iterator[Span]:
    operation = _OPERATIONS.get(type(request), type(request).__name__)
    name = f"{operation} {getattr(table, 'table_name', '')}".rstrip()
    measured = _metrics.enabled()
    status: list[int | None] = [None]
    token = _STATUS.set(status)
    error: str | None = None
    started = time.perf_counter()
    with trace.get_tracer(SCOPE).start_as_current_span(
        name, kind=SpanKind.CLIENT, record_exception=False, set_status_on_exception=False
    ) as span:
        recording = span.is_recording()  # else the API's no-op: nothing is worked out for it
        where = _where(table) if recording or measured else {}
        if recording:
            span.set_attributes(where)
            span.set_attribute("db.operation.name", operation)
            if isinstance(request, SubmitTransaction):
                span.set_attribute("db.operation.batch.size", len(request.operations))
            if resent:
                span.set_attribute("http.request.resend_count", resent)
        try:
            yield span
        except Exception as exc:
            error = _failed(span, exc)
            answer = getattr(exc, "status_code", None)
            if isinstance(answer, int):
                status[0] = answer
            raise
        finally:
            _STATUS.reset(token)
            if measured:
                _metrics.record(where, operation, status[0], error, time.perf_counter() - started)


def _failed(span: Span, exc: Exception) -> str:
    """The error's kind, noted on the span: the service's error code when it
    answered with one, else the exception's class (no message: it may quote a
    request)."""
    kind = error_code(exc) or f"{type(exc).__module__}.{type(exc).__qualname__}"
    if not span.is_recording():
        return kind
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):  # noted by the answer already, unless the runner mapped it
        span.set_attribute("http.response.status_code", status)
        span.set_attribute("db.response.status_code", str(status))
    span.set_attribute("error.type", kind)
    span.set_status(StatusCode.ERROR)
    return kind


def _note(span: Span, status: int, headers: Mapping[str, str] | None) -> None:
    span.set_attribute("http.response.status_code", status)
    span.set_attribute("db.response.status_code", str(status))
    request_id = headers.get("x-ms-request-id") if headers is not None else None
    if request_id:
        span.set_attribute("az.service_request_id", request_id)


def answered(status: int, headers: Mapping[str, str]) -> None:
    """Note an answer on the current request's span (the runner's I/O calls it)."""
    noted = _STATUS.get()
    if noted is not None:
        noted[0] = status
    span = trace.get_current_span()
    if span.is_recording():
        _note(span, status, headers)


def sdk_hook(table: object) -> Callable[[Any], None]:
    """A ``raw_response_hook`` for one SDK call: it notes the answer, then
    calls the hook the client was built with (a call's hook replaces it)."""
    policy = getattr(getattr(getattr(table, "_client", None), "_config", None),
                     "custom_hook_policy", None)  # fmt: skip
    own = getattr(policy, "_response_callback", None)

    def hook(response: Any) -> None:
        http = response.http_response
        answered(http.status_code, http.headers)
        if callable(own):
            own(response)

    return hook


def attempt(
    table: object, perform: Callable[[Request, float | None], T]
) -> Callable[[Request, float | None], T]:
    """``perform`` with a span per try; the tries after the first counted."""
    tries = 0

    def traced(request: Request, deadline: float | None) -> T:
        nonlocal tries
        tries += 1
        with _span(table, request, tries - 1):
            return perform(request, deadline)

    return traced


def attempt_async(
    table: object, perform: Callable[[Request, float | None], Awaitable[T]]
) -> Callable[[Request, float | None], Awaitable[T]]:
    """As :func:`attempt`, for the async runner."""
    tries = 0

    async def traced(request: Request, deadline: float | None) -> T:
        nonlocal tries
        tries += 1
        with _span(table, request, tries - 1):
            return await perform(request, deadline)

    return traced
