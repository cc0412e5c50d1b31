"""With ``opentelemetry-api`` alone (no SDK) every span is a no-op and no
header is added to any message, even where the application runs the
consumer inside a context it took from a request of its own (the API's
propagator reads one without an SDK, and its no-op spans hold on to it)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from azure.data.tables import TableClient
from azure.storage.queue import QueueClient
from opentelemetry import context, trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from handlers import HandlerContext, InMemoryPublisher, Message, Processor, QueueConsumer, handler
from tests.queueing import Seen, send


@handler("Echo", Seen, types=["Add"])
def echo(state: Seen, message: Message, ctx: HandlerContext) -> None:
    """Sends on the headers it was given, in its output's body and headers."""
    state.ids.append(message.id)
    ctx.publish("Echoed", {"headers": dict(message.headers)}, headers=dict(message.headers))


@pytest.fixture
def ambient() -> Iterator[None]:
    """The application's own context, read from its request's headers."""
    assert not trace.get_tracer("tests").start_span("probe").is_recording()  # no SDK
    read = {"traceparent": f"00-{uuid.uuid4().int >> 1:032x}-{uuid.uuid4().int >> 65:016x}-01"}
    token = context.attach(TraceContextTextMapPropagator().extract(read))
    try:
        yield
    finally:
        context.detach(token)


def test_a_consumer_in_the_application_s_context_adds_no_header(
    table: TableClient, queue: QueueClient, ambient: None
) -> None:
    key = f"k-{uuid.uuid4().hex[:8]}"
    send(queue, Message("m-1", key, "Add", {"n": 1}))  # sent without headers
    publisher = InMemoryPublisher()
    consumer = QueueConsumer(Processor(echo, table, publisher), queue, backoff=timedelta(0))

    stats = consumer.run(until_empty=True)

    assert (stats.received, stats.completed) == (1, 1)
    assert [(o.type, o.body, dict(o.headers)) for o in publisher.deliveries] == [
        ("Echoed", {"headers": {}}, {})
    ]
