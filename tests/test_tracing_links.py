"""An input's trace context as a link rather than a parent, as configured:
the message is processed in a trace of its own, linked to its sender's."""

from __future__ import annotations

import uuid

import pytest
from azure.data.tables import TableClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from handlers import InMemoryPublisher, Message, Processor
from tests.queueing import add, tally


def test_a_linked_message_is_processed_in_a_trace_of_its_own(
    table: TableClient, spans: InMemorySpanExporter
) -> None:
    publisher = InMemoryPublisher()
    processor = Processor(tally, table, publisher, trace_context="link")
    trace_id, sender = uuid.uuid4().int >> 1, uuid.uuid4().int >> 65
    added = add(1, f"k-{uuid.uuid4().hex[:8]}", 2)
    headers = {"traceparent": f"00-{trace_id:032x}-{sender:016x}-01"}

    outcome = processor.process(Message(added.id, added.key, added.type, added.body, headers))

    assert outcome.status == "completed"
    made = {s.name: s for s in spans.get_finished_spans()}
    process = made["process Tally"]
    assert process.parent is None  # a root: no sender's span above it
    assert process.context.trace_id != trace_id
    assert [(k.context.trace_id, k.context.span_id) for k in process.links] == [(trace_id, sender)]
    assert {s.context.trace_id for s in made.values()} == {process.context.trace_id}
    (published,) = publisher.deliveries  # its output carries its own trace on
    assert published.headers["traceparent"].split("-")[1] == f"{process.context.trace_id:032x}"


def test_a_trace_context_that_is_neither_is_refused(table: TableClient) -> None:
    with pytest.raises(ValueError, match="trace_context must be 'parent' or 'link', got 'child'"):
        Processor(tally, table, InMemoryPublisher(), trace_context="child")  # type: ignore[arg-type]


def test_the_spark_job_takes_the_setting_and_refuses_another() -> None:
    from spark_driver import JobSettings

    linked = JobSettings(table="t", handler="shooting_range", trace_context="link")
    assert linked.trace_context == "link"
    with pytest.raises(ValueError, match="trace_context must be 'parent' or 'link', got 'child'"):
        JobSettings(table="t", handler="shooting_range", trace_context="child")  # type: ignore[arg-type]
