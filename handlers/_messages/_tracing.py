"""The trace a message carries: W3C Trace Context in its headers.

An input's ``traceparent`` (and ``tracestate``) is the parent of the spans
made for it; an output carries the context of the span that published it.
Those headers are transport metadata, as a queue envelope's ``produced`` is:
never part of what a message is (see :meth:`Message.identity`), so a copy
delivered under another trace is the same message and gives the same outputs.

Spans go through the OpenTelemetry API: without an SDK installed they are
no-ops, and nothing is added to any message. The headers read and written
are W3C Trace Context's alone, whatever propagators the application set (its
baggage, B3's headers): the very headers :meth:`Message.identity` leaves out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Final, Literal

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ._message import Message, without_trace

__all__ = [
    "SCOPE",
    "TraceContext",
    "carrying",
    "check_trace_context",
    "context_of",
    "failed",
    "failed_as",
    "message_attributes",
    "message_span",
    "origin",
    "tracer",
]

#: The instrumentation scope of the runtime's spans.
SCOPE: Final = "handlers"
#: Not the global propagator: another one (baggage, B3) would put headers in an
#: output that differ from copy to copy and that its identity keeps.
_W3C: Final = TraceContextTextMapPropagator()

#: What an input's trace context is to the spans made for it: their
#: ``"parent"`` (they join the sender's trace), or a ``"link"`` from spans
#: made in the context current where it is handled (a trace of their own).
TraceContext = Literal["parent", "link"]


def check_trace_context(value: object) -> TraceContext:
    if value not in ("parent", "link"):
        raise ValueError(f"trace_context must be 'parent' or 'link', got {value!r}")
    return "parent" if value == "parent" else "link"


def tracer() -> trace.Tracer:
    # Asked for at each use, not kept: the application may set its provider
    # after this module is imported.
    return trace.get_tracer(SCOPE)


def context_of(message: Message) -> otel_context.Context | None:
    """The context an input's headers carry, or None (then the current one
    is the parent)."""
    headers = message.headers
    if "traceparent" not in headers:
        return None
    found = _W3C.extract(dict(headers))
    # A traceparent that does not read is no parent: the current context stands.
    return found if trace.get_current_span(found).get_span_context().is_valid else None


def origin(
    message: Message | None, trace_context: TraceContext
) -> tuple[otel_context.Context | None, list[Link]]:
    """The parent of a span made for ``message`` (None: the current context)
    and its links: the context its headers carry, as one or the other."""
    found = context_of(message) if message is not None else None
    if found is None or trace_context == "parent":
        return found, []
    return None, [Link(trace.get_current_span(found).get_span_context())]


def message_attributes(message: Message) -> dict[str, Any]:
    return {
        "messaging.message.id": message.id,
        "streamstone.message.key": message.key,
        "streamstone.message.type": message.type,
    }


@contextmanager
def message_span(
    name: str,
    message: Message | None,
    kind: SpanKind,
    *,
    start_time: int | None = None,
    trace_context: TraceContext = "parent",
    **attributes: Any,
) -> Iterator[Span]:
    """A span of what is done with ``message``, a child of the context its
    headers carry (or linked to it); an exception marks it failed (its
    class, no message text)."""
    parent, links = origin(message, trace_context)
    with tracer().start_as_current_span(
        name,
        context=parent,
        kind=kind,
        links=links,
        start_time=start_time,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        if span.is_recording():
            if message is not None:
                span.set_attributes(message_attributes(message))
            span.set_attributes({k: v for k, v in attributes.items() if v is not None})
        try:
            yield span
        except Exception as exc:
            failed(span, exc)
            raise


def failed(span: Span, exc: BaseException) -> None:
    failed_as(span, f"{type(exc).__module__}.{type(exc).__qualname__}")


def failed_as(span: Span, kind: str) -> None:
    """Mark ``span`` failed, with ``kind`` as its ``error.type``."""
    if span.is_recording():
        span.set_attribute("error.type", kind)
        span.set_status(StatusCode.ERROR)


def carrying(
    output: Message, span: Span, check: Callable[[Message], None] | None = None
) -> Message:
    """``output`` with ``span``'s context in its headers, in place of any it
    had (a handler may have copied its input's); itself when there is none.

    ``check`` is the publisher's (``ValueError`` for an output it could not
    deliver). It passed the output as the handler made it, before its state
    was stored; the trace must not make it fail now (a sender's tracestate
    may hold 8 KiB): one it refuses goes with the traceparent alone, else with
    no trace header."""
    if not span.get_span_context().is_valid:
        return output
    headers: dict[str, str] = {}
    _W3C.inject(headers, context=trace.set_span_in_context(span))
    if not headers:
        return output
    plain = without_trace(output.headers)
    for trace_headers in (headers, {"traceparent": headers["traceparent"]}):
        carried = replace(output, headers={**plain, **trace_headers})
        try:
            if check is not None:
                check(carried)
        except (ValueError, TypeError):
            continue
        return carried
    return replace(output, headers=plain)
