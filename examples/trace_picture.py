"""The picture of one message's trace in docs/observability.md, from a real run.

One ``FireAt`` message, sent under its sender's ``traceparent``, goes through
a ``QueueConsumer`` (the default wire runner, its output to a queue) with the
OpenTelemetry SDK's in-memory exporter; its spans become a Mermaid gantt
chart, one bar per span, children under their parent, each with its time.

Run it beside Azurite (``make azurite`` prints the export line):
``python examples/trace_picture.py`` prints the block;
``python examples/trace_picture.py --write docs/observability.md`` puts it in
the page, between its ``trace picture`` markers.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import math
import os
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

from azure.core.exceptions import ResourceExistsError
from azure.data.tables import TableServiceClient
from azure.storage.queue import QueueServiceClient
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from handlers import Message, Processor, QueueConsumer, QueuePublisher, encode_envelope
from handlers.examples import shooting_range
from streamstone_py import WireTableClient

BEGIN = "<!-- trace picture: begin (examples/trace_picture.py writes it) -->"
END = "<!-- trace picture: end -->"
QUEUE, TABLE = "trace-picture", "tracepicture"
#: The sender's span, as a producer's traceparent carries it.
SENDER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def one_message(connection_string: str) -> list[ReadableSpan]:
    """The spans of one message through a consumer, recorded by the SDK."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    queues = QueueServiceClient.from_connection_string(connection_string)
    for name in (QUEUE, f"{QUEUE}-out"):
        with contextlib.suppress(ResourceExistsError):
            queues.create_queue(name)
    TableServiceClient.from_connection_string(connection_string).create_table_if_not_exists(TABLE)
    table = WireTableClient.from_connection_string(connection_string, TABLE)
    processor = Processor(shooting_range, table, QueuePublisher(queues, lambda m: f"{QUEUE}-out"))
    game = f"game-{uuid.uuid4().hex[:8]}"
    shot = Message(f"{game}-shot", game, "FireAt", {"position": 3}, {"traceparent": SENDER})
    inbox = queues.get_queue_client(QUEUE)
    inbox.send_message(base64.b64encode(encode_envelope(shot).encode()).decode())
    stats = QueueConsumer(processor, inbox).run(until_empty=True)
    if stats.completed != 1:
        raise SystemExit(f"the message was not completed: {stats}")
    queues.get_queue_client(f"{QUEUE}-out").clear_messages()
    return list(exporter.get_finished_spans())


def gantt(spans: Sequence[ReadableSpan]) -> list[str]:
    """A Mermaid gantt block: a section per span under the sender's, each
    span a bar (milliseconds from the first start), its children after it."""
    ids = {s.context.span_id for s in spans}
    start = min(s.start_time or 0 for s in spans)

    def children(of: int | None) -> list[ReadableSpan]:
        found = [s for s in spans if (s.parent.span_id if s.parent and s.parent.span_id in ids
                                      else None) == of]  # fmt: skip
        return sorted(found, key=lambda s: s.start_time or 0)

    lines = ["```mermaid", "gantt", "    title One message's trace (ms from its receive)",
             "    dateFormat x", "    axisFormat %L ms"]  # fmt: skip

    def bars(span: ReadableSpan, depth: int) -> None:
        begin = ((span.start_time or 0) - start) / 1e6
        end = ((span.end_time or 0) - start) / 1e6
        # A bar of at least 1 ms, so that the shortest shows; its label has its time.
        low = math.floor(begin)
        high = max(low + 1, math.ceil(end))
        label = f"{'· ' * depth}{span.name} {end - begin:.1f} ms"
        lines.append(f"    {label} :{low}, {high}")
        for child in children(span.context.span_id):
            bars(child, depth + 1)

    for root in children(None):
        lines.append(f"    section {root.name.split()[0]}")
        bars(root, 0)
    lines.append("```")
    return lines


def write(page: Path, block: list[str]) -> None:
    text = page.read_text()
    before, found, rest = text.partition(BEGIN)
    _, ended, after = rest.partition(END)
    if not found or not ended:
        raise SystemExit(f"{page}: no {BEGIN!r} ... {END!r} markers")
    page.write_text(before + BEGIN + "\n" + "\n".join(block) + "\n" + END + after)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--write", type=Path, help="the page whose picture to replace")
    args = parser.parse_args(argv)
    connection_string = os.environ.get("STREAMSTONE_CONNECTION_STRING")
    if not connection_string:
        print("set STREAMSTONE_CONNECTION_STRING (make azurite prints the line)", file=sys.stderr)
        return 2
    block = gantt(one_message(connection_string))
    if args.write is None:
        print("\n".join(block))
    else:
        write(args.write, block)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
