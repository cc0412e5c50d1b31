"""Log lines carry the trace and span ids of the span current where they are
made, through the ``TraceIds`` filter on the application's handler: the
consumer's WARNING for a message abandoned, then poisoned, is in the trace
its sender started."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from azure.data.tables import TableClient
from azure.storage.queue import QueueClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from handlers import InMemoryPublisher, Message, Processor, QueueConsumer
from streamstone_py import TraceIds
from tests.queueing import add, send, tally


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _ids(record: logging.LogRecord) -> tuple[object, ...]:
    return tuple(vars(record)[k] for k in ("otelTraceID", "otelSpanID", "otelTraceSampled"))


@pytest.fixture
def kept() -> Iterator[_Kept]:
    """The records of the packages' loggers, through a handler with the filter."""
    handler = _Kept()
    handler.addFilter(TraceIds())
    loggers = [logging.getLogger(name) for name in ("handlers", "tests")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)


def test_the_warning_for_a_failing_message_is_in_its_sender_s_trace(
    table: TableClient, queue: QueueClient, spans: InMemorySpanExporter, kept: _Kept
) -> None:
    key = f"k-{uuid.uuid4().hex[:8]}"
    trace_id, sender = uuid.uuid4().int >> 1, uuid.uuid4().int >> 65
    broken = add(1, key, 2, "Broken")
    headers = {"traceparent": f"00-{trace_id:032x}-{sender:016x}-01"}
    send(queue, Message(broken.id, key, broken.type, broken.body, headers))
    consumer = QueueConsumer(Processor(tally, table, InMemoryPublisher()), queue,
                             max_dequeue_count=2, backoff=timedelta(0))  # fmt: skip

    consumer.run(until_empty=True)
    logging.getLogger("tests").info("no span here")

    settled = {s.name.split()[0]: s.context.span_id for s in spans.get_finished_spans()
               if s.name.split()[0] in ("abandon", "poison")}  # fmt: skip
    lines = [(r.levelname, r.getMessage().split()[0], *_ids(r)) for r in kept.records
             if r.levelno >= logging.WARNING or r.name == "tests"]  # fmt: skip
    assert lines == [
        ("WARNING", "abandoned", f"{trace_id:032x}", f"{settled['abandon']:016x}", True),
        ("WARNING", "poisoned", f"{trace_id:032x}", f"{settled['poison']:016x}", True),
        ("INFO", "no", "0", "0", False),
    ]


def test_without_an_sdk_a_record_says_no_trace(kept: _Kept) -> None:
    logging.getLogger("tests").info("one line")

    (record,) = kept.records
    assert _ids(record) == ("0", "0", False)


def test_the_warning_for_a_failing_message_sent_untraced_is_in_its_processing_s_trace(
    table: TableClient, queue: QueueClient, spans: InMemorySpanExporter, kept: _Kept
) -> None:
    key = f"k-{uuid.uuid4().hex[:8]}"
    send(queue, add(1, key, 2, "Broken"))  # no trace headers: its sender does not trace
    consumer = QueueConsumer(Processor(tally, table, InMemoryPublisher()), queue,
                             max_dequeue_count=1, backoff=timedelta(0))  # fmt: skip

    consumer.run(until_empty=True)

    traces = {s.name.split()[0]: s.context.trace_id for s in spans.get_finished_spans()}
    (line,) = [r for r in kept.records if r.levelno >= logging.WARNING]
    assert line.getMessage().split()[0] == "poisoned"
    assert _ids(line)[0] == f"{traces['process']:032x}"
    assert traces["receive"] == traces["process"] == traces["poison"]
