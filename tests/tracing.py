"""Spans recorded by the OpenTelemetry SDK for one test: its in-memory
exporter behind the global tracer provider, which the API sets once per
process, so it is set here for the test and taken back after it (the other
tests run with the API's no-op spans, as an application without the SDK)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

__all__ = ["install", "recording", "texts_of"]


def install(provider: TracerProvider | None) -> None:
    """The global provider, which the API sets once per process: replaced here."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = provider


@contextmanager
def recording() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    install(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        install(None)


def texts_of(spans: Iterable[ReadableSpan]) -> list[str]:
    """Every name, attribute name and attribute value, event and link of the spans, as text."""
    texts: list[str] = []
    for span in spans:
        texts.append(span.name)
        values: list[Any] = [*(span.attributes or {}).items()]
        for event in span.events:
            values += [event.name, *(event.attributes or {}).items()]
        for link in span.links:
            values += [*(link.attributes or {}).items()]
        texts += [str(v) for v in values]
    return texts
