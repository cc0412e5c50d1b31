"""The trace of a message through the runtime: the consumer's receive and
settling, the processing of its key-batch with the storage requests inside,
and its outputs published carrying the trace on; and trace headers that never
change what an output is."""

from __future__ import annotations

import uuid
from datetime import timedelta

from azure.data.tables import TableClient
from azure.storage.queue import QueueClient, QueueServiceClient
from opentelemetry import trace
from opentelemetry.propagate import inject
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from handlers import (
    HandlerContext,
    InMemoryPublisher,
    Message,
    Processor,
    QueueConsumer,
    QueuePublisher,
    handler,
    read_queue_text,
)
from handlers.testing import check_handler
from tests.helpers import drain
from tests.queueing import Tally, add, send, states, tally


def _traceparent() -> tuple[str, int, int]:
    """A sender's context: its traceparent, trace id and span id."""
    trace_id, span_id = uuid.uuid4().int >> 1, uuid.uuid4().int >> 65
    return f"00-{trace_id:032x}-{span_id:016x}-01", trace_id, span_id


def _under(message: Message, traceparent: str) -> Message:
    return Message(message.id, message.key, message.type, message.body,
                   {**message.headers, "traceparent": traceparent})  # fmt: skip


def test_one_message_through_a_consumer_is_one_trace_its_output_carries_on(
    table: TableClient, queues: QueueServiceClient, queue: QueueClient, spans: InMemorySpanExporter
) -> None:
    out = f"{queue.queue_name}-out"
    queues.create_queue(out)
    key = f"k-{uuid.uuid4().hex[:8]}"
    traceparent, trace_id, sender = _traceparent()
    sent = _under(add(1, key, 2), traceparent)
    send(queue, Message(sent.id, key, sent.type, sent.body,
                        {**sent.headers, "tracestate": "vendor=7"}))  # fmt: skip
    processor = Processor(tally, table, QueuePublisher(queues, lambda m: out))

    stats = QueueConsumer(processor, queue, backoff=timedelta(0)).run(until_empty=True)

    assert (stats.received, stats.completed) == (1, 1)
    made = spans.get_finished_spans()
    assert states(processor, key) == {key: (1, Tally(2, ["m-1"]))}
    (output,) = [read_queue_text(t) for t in drain(queues.get_queue_client(out))]
    assert {s.context.trace_id for s in made} == {trace_id}
    by_name = {s.name: s for s in made}
    assert len(by_name) == len(made) == 6
    name, store = queue.queue_name, table.table_name

    def parent(span: ReadableSpan) -> str:
        assert span.parent is not None
        if span.parent.span_id == sender:
            return "sender"
        return next(s.name for s in made if s.context.span_id == span.parent.span_id)

    assert {s.name: (s.kind, parent(s)) for s in made} == {
        f"receive {name}": (SpanKind.CONSUMER, "sender"),
        "process Tally": (SpanKind.CONSUMER, "sender"),
        "process_batch Tally": (SpanKind.INTERNAL, "process Tally"),
        f"submit_transaction {store}": (SpanKind.CLIENT, "process_batch Tally"),
        "publish Tally": (SpanKind.PRODUCER, "process Tally"),
        f"delete {name}": (SpanKind.CLIENT, "sender"),
    }
    received = by_name[f"receive {name}"].attributes or {}
    queue_id = received["streamstone.queue.message_id"]
    the_message = {
        "messaging.message.id": "m-1",
        "streamstone.message.key": key,
        "streamstone.message.type": "Add",
    }
    on_the_queue = {
        **the_message,
        "messaging.system": "azure.storage.queues",
        "messaging.destination.name": name,
        "streamstone.queue.message_id": queue_id,
        "streamstone.queue.dequeue_count": 1,
    }
    assert dict(received) == {
        **on_the_queue,
        "messaging.operation.type": "receive",
        "messaging.operation.name": "receive",
    }
    assert dict(by_name[f"delete {name}"].attributes or {}) == {
        **on_the_queue,
        "messaging.operation.type": "settle",
        "messaging.operation.name": "delete",
    }
    assert dict(by_name["process Tally"].attributes or {}) == {
        **the_message,
        "messaging.operation.type": "process",
        "streamstone.handler": "Tally",
        "streamstone.outcome": "completed",
        "streamstone.duplicate": False,
        "streamstone.outputs": 1,
        "streamstone.version": 1,
    }
    assert dict(by_name["process_batch Tally"].attributes or {}) == {
        "streamstone.handler": "Tally",
        "streamstone.message.key": key,
        "messaging.batch.message_count": 1,
    }
    assert dict(by_name["publish Tally"].attributes or {}) == {
        "messaging.message.id": output.id,
        "streamstone.message.key": key,
        "streamstone.message.type": "Added",
        "messaging.operation.type": "send",
        "streamstone.handler": "Tally",
    }
    publish = by_name["publish Tally"].context.span_id
    assert dict(output.headers) == {
        "traceparent": f"00-{trace_id:032x}-{publish:016x}-01",
        "tracestate": "vendor=7",  # the sender's, carried on
    }
    assert output.body == {"total": 2, "by": "m-1"}


def test_a_failing_message_is_abandoned_then_poisoned_in_its_sender_s_trace(
    table: TableClient, queues: QueueServiceClient, queue: QueueClient, spans: InMemorySpanExporter
) -> None:
    key = f"k-{uuid.uuid4().hex[:8]}"
    traceparent, trace_id, sender = _traceparent()
    send(queue, _under(add(1, key, 2, "Broken"), traceparent))
    processor = Processor(tally, table, InMemoryPublisher())
    consumer = QueueConsumer(processor, queue, max_dequeue_count=2, backoff=timedelta(0))

    stats = consumer.run(until_empty=True)

    assert (stats.received, stats.abandoned, stats.poisoned) == (2, 1, 1)
    made = sorted(spans.get_finished_spans(), key=lambda s: s.start_time or 0)
    assert {s.context.trace_id for s in made} == {trace_id}
    name = queue.queue_name
    # Each try's point reads, under the batch's span: the key's header, and whether the
    # failing message is stored.
    reads = [f"get_entity {table.table_name}"] * 3
    tries = [f"receive {name}", "process Tally", "process_batch Tally", *reads]
    assert [s.name for s in made] == [*tries, f"abandon {name}", *tries, f"poison {name}"]
    batches = {s.context.span_id for s in made if s.name == "process_batch Tally"}
    assert {s.parent.span_id for s in made if s.name in reads and s.parent} == batches
    settled = [s for s in made if s.name.split()[0] in ("abandon", "poison")]
    assert [s.parent.span_id if s.parent else None for s in settled] == [sender, sender]
    assert [(s.kind, s.status.status_code) for s in settled] == [
        (SpanKind.CLIENT, StatusCode.UNSET),
        (SpanKind.PRODUCER, StatusCode.UNSET),
    ]
    assert [dict(s.attributes or {}).get("streamstone.queue.dequeue_count") for s in settled] == [
        1,
        2,
    ]
    assert dict(settled[1].attributes or {})["streamstone.outcome"] == "failed"
    processed = [dict(s.attributes or {}) for s in made if s.name == "process Tally"]
    assert [(a["streamstone.outcome"], a["error.type"]) for a in processed] == [
        ("failed", "failed"),
        ("failed", "failed"),
    ]


@handler("Echo", Tally, types=["Add"])
def echo(state: Tally, message: Message, ctx: HandlerContext) -> None:
    """Passes its input's headers on to its output, as handlers that forward
    correlation headers do: the trace headers go with them."""
    state.total += message.body["n"]
    state.seen.append(message.id)
    ctx.publish("Echoed", {"total": state.total}, headers=dict(message.headers))


def test_a_copy_redelivered_under_another_trace_gives_the_same_outputs(
    table: TableClient, spans: InMemorySpanExporter
) -> None:
    publisher = InMemoryPublisher()
    processor = Processor(echo, table, publisher)
    key = f"k-{uuid.uuid4().hex[:8]}"
    first_trace, _, _ = _traceparent()
    second_trace, second_id, _ = _traceparent()
    message = _under(add(1, key, 2), first_trace)

    first = processor.process(message)
    again = processor.process(_under(message, second_trace))  # the producer sent it again

    assert (first.status, again.status) == ("completed", "duplicate")
    assert states(processor, key) == {key: (1, Tally(2, ["m-1"]))}
    assert [o.identity() for o in again.outputs] == [o.identity() for o in first.outputs]
    assert [dict(o.headers) for o in again.outputs] == [{"traceparent": second_trace}]
    assert publisher.divergent == []
    # Each went out carrying the trace it was processed in.
    assert [o.headers["traceparent"].split("-")[1] for o in publisher.deliveries] == [
        first_trace.split("-")[1],
        f"{second_id:032x}",
    ]
    duplicate = [
        dict(s.attributes or {}) for s in spans.get_finished_spans() if s.name == "process Echo"
    ]
    assert [(a["streamstone.outcome"], a["streamstone.duplicate"]) for a in duplicate] == [
        ("completed", False),
        ("duplicate", True),
    ]


def test_without_an_sdk_nothing_is_added_to_an_output(table: TableClient) -> None:
    publisher = InMemoryPublisher()
    key = f"k-{uuid.uuid4().hex[:8]}"
    outcome = Processor(tally, table, publisher).process(add(1, key, 2))

    assert outcome.status == "completed"
    assert [dict(o.headers) for o in publisher.deliveries] == [{}]


@handler("Traced", Tally, types=["Add"])
def traced(state: Tally, message: Message, ctx: HandlerContext) -> None:
    """Instruments its own work with a span, and sends that span's context on."""
    with trace.get_tracer("tests").start_as_current_span("adding"):
        state.total += message.body["n"]
        headers: dict[str, str] = {}
        inject(headers)
        ctx.publish("Added", {"total": state.total}, headers=headers)


def test_check_handler_leaves_the_trace_headers_out(spans: InMemorySpanExporter) -> None:
    report = check_handler(traced, [add(1, "k", 2), add(2, "k", 3)], hash_seeds=())

    assert report.differences == ()
    assert [s.name for s in spans.get_finished_spans()] == ["adding"] * 4  # each message twice
