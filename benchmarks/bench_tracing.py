"""What OpenTelemetry costs ``process_batch``: the API alone, and the SDK exporting.

- ``tracing.process_batch.api_only``: messages per second through
  ``Processor.process_batch`` (the wire runner, 20 messages per key) with
  ``opentelemetry-api`` alone, as an application without the SDK runs it,
  beside the same code with every tracing and metrics call bypassed (the
  batch's spans, the storage request spans and their duration metric).
  Target: at least 0.98.
- ``tracing.process_batch.sdk``: the same with the SDK recording every span
  and metric, a ``BatchSpanProcessor`` and a periodic metric reader sending
  OTLP/HTTP to a receiver on a loopback port (its flush timed with the
  work), beside the API alone: the ratio is what exporting costs.
- ``tracing.cost_per_message``: the SDK's extra time per message, in µs.

Each repeat runs the three, in turn, on fresh keys; the check: every message
completed, and with the SDK the receiver got one ``process`` span per message.

Run: ``python benchmarks/bench_tracing.py [--quick]``.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

from _common import account, check, emit, log, quick
from azure.data.tables import TableServiceClient
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import handlers._processor
import streamstone_py._transport._tracing as storage_tracing
import streamstone_py._transport._wire._client as wire_client
from handlers import InMemoryPublisher, Message, Processor
from handlers._outcome import Step
from handlers.examples import shooting_range
from streamstone_py import WireTableClient
from tests.metrics import install as install_meters
from tests.otlp import Received, receiving
from tests.tracing import install as install_tracer

PER_KEY = 20


def messages_for(key: str) -> list[Message]:
    return [Message(f"{key}-round", key, "StartNewRound")] + [
        Message(f"{key}-shot-{n}", key, "FireAt", {"position": n % 100}) for n in range(1, PER_KEY)
    ]


class _Untraced:
    """What ``processing`` yields, without a span or a measurement."""

    @contextmanager
    def publishing(
        self, steps: Sequence[Step], check: Callable[[Message], None] | None = None
    ) -> Iterator[list[Message]]:
        yield [output for step in steps for output in step.outputs]

    def tell(self, outcomes: Sequence[Any]) -> None:
        pass


@contextmanager
def _untraced_processing(*args: Any) -> Iterator[_Untraced]:
    yield _Untraced()


def _untraced_attempt(table: object, perform: Callable[..., Any]) -> Callable[..., Any]:
    return perform


@contextmanager
def bypassed() -> Iterator[None]:
    """Every tracing and metrics call of the processor and the storage requests skipped."""
    swaps = [
        (vars(handlers._processor), "processing", _untraced_processing),
        (vars(storage_tracing), "attempt", _untraced_attempt),
        (vars(wire_client), "answered", lambda status, headers: None),
    ]
    kept = [(names, name, names[name]) for names, name, _ in swaps]
    for names, name, replacement in swaps:
        names[name] = replacement
    try:
        yield
    finally:
        for names, name, original in kept:
            names[name] = original


@contextmanager
def exporting(received: Received) -> Iterator[None]:
    """The SDK behind the global providers, batching to the receiver; flushed on leaving."""
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{received.url}/v1/traces"))
    )
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=f"{received.url}/v1/metrics")
    )
    meter_provider = MeterProvider(metric_readers=[reader])
    install_tracer(tracer_provider)
    install_meters(meter_provider)
    try:
        yield
        tracer_provider.force_flush()
        meter_provider.force_flush()
    finally:
        tracer_provider.shutdown()
        meter_provider.shutdown()
        install_tracer(None)
        install_meters(None)


def sample(table: WireTableClient, keys: int, around: Callable[[], Any]) -> float:
    """Messages per second of one run over fresh keys, ``around`` it."""
    processor = Processor(shooting_range, table, InMemoryPublisher())
    batches = {key: messages_for(key) for key in (f"k{uuid.uuid4().hex[:10]}" for _ in range(keys))}
    start = time.perf_counter()
    with around():
        for key, messages in batches.items():
            processor.process_batch(key, messages)
    elapsed = time.perf_counter() - start
    total = keys * PER_KEY
    check(processor.stats.completed == total, f"{processor.stats.completed} of {total} completed")
    return total / elapsed


def main() -> int:
    is_quick = quick(__doc__)
    keys, repeats = (10, 5) if is_quick else (40, 11)
    with account() as connection_string, receiving() as received:
        service = TableServiceClient.from_connection_string(connection_string)
        name = "benchtracing" + uuid.uuid4().hex[:8]
        service.create_table(name)
        table = WireTableClient.from_connection_string(connection_string, name)
        sample(table, keys, nullcontext)  # warm: connections, imports
        series: dict[str, list[float]] = {"api": [], "bypassed": [], "sdk": []}
        modes: dict[str, Callable[[], Any]] = {
            "api": nullcontext,
            "bypassed": bypassed,
            "sdk": lambda: exporting(received),
        }
        log(f"tracing: {keys} keys x {PER_KEY} messages x {repeats} repeats, three ways")
        order = list(modes)
        for i in range(repeats):
            for mode in order[i % 3 :] + order[: i % 3]:  # who goes first rotates
                series[mode].append(sample(table, keys, modes[mode]))
        exported = [s for s in received.spans() if s.name.startswith("process ShootingRange")]
        processed = repeats * keys * PER_KEY
        check(len(exported) == processed, f"{len(exported)} process spans of {processed} exported")
        service.delete_table(name)
    params = {"keys": keys, "messages_per_key": PER_KEY, "runner": "wire"}
    emit("tracing.process_batch.api_only", "messages/s", "higher", series["api"],
         "tracing calls bypassed", series["bypassed"], params)  # fmt: skip
    exporter = {**params, "exporter": "OTLP/HTTP, batched"}
    emit("tracing.process_batch.sdk", "messages/s", "higher", series["sdk"],
         "API alone (no SDK)", series["api"], exporter)  # fmt: skip
    extra = [1e6 / s - 1e6 / a for s, a in zip(series["sdk"], series["api"], strict=True)]
    emit("tracing.cost_per_message", "µs", "lower", extra, None, None, params)
    medians = {k: round(statistics.median(v)) for k, v in series.items()}
    log(f"medians: {medians}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
