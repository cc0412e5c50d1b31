"""The consumer's spans of a queue message: its receive, then its delete,
abandon or poison entry, each a child of the context the message's headers
carry (see ``handlers._messages._tracing``; the receive's own, for a message
that carries none), so they sit in its trace beside its processing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

from opentelemetry.trace import Span, SpanKind, get_current_span

from .._messages._message import Message
from .._messages._tracing import TraceContext, carrying, context_of, message_span
from ._locks import Held

__all__ = ["queue_span", "received"]

#: No well-known ``messaging.system`` names Azure Storage Queues: ours.
SYSTEM: Final = "azure.storage.queues"


def _attributes(operation: str, queue: str, held: Held) -> dict[str, Any]:
    return {
        "messaging.system": SYSTEM,
        "messaging.operation.name": operation,
        "messaging.destination.name": queue,
        "streamstone.queue.message_id": held.id,
        "streamstone.queue.dequeue_count": held.count,
    }


def received(
    queue: str, held: Held, message: Message, started: int, trace_context: TraceContext
) -> Message:
    """The receive of an admitted message: from the page's request (``started``,
    in ns since the epoch) to its admission. A message that carries no trace
    context is given its receive's (as its parent: ``"parent"``), so that its
    processing, its settling and their log lines are one trace."""
    around = get_current_span().get_span_context()
    with message_span(
        f"receive {queue}",
        message,
        SpanKind.CONSUMER,
        start_time=started,
        trace_context=trace_context,
        **{"messaging.operation.type": "receive", **_attributes("receive", queue, held)},
    ) as span:
        pass
    if trace_context != "parent" or context_of(message) is not None:
        return message
    # The API alone makes no span: it hands back the context current here (an
    # application's, read from a request of its own), and adds no header.
    return carrying(message, span) if span.get_span_context() != around else message


@contextmanager
def queue_span(
    operation: str,
    queue: str,
    held: Held,
    message: Message | None,
    *,
    trace_context: TraceContext,
    **attributes: Any,
) -> Iterator[Span]:
    """A settling of ``held`` on the queue (``delete``, ``abandon``, ``poison``)."""
    kind = "settle" if operation != "poison" else "send"
    with message_span(
        f"{operation} {queue}",
        message,
        SpanKind.PRODUCER if operation == "poison" else SpanKind.CLIENT,
        trace_context=trace_context,
        **{"messaging.operation.type": kind, **_attributes(operation, queue, held), **attributes},
    ) as span:
        yield span
