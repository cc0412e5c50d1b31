"""Metrics recorded by the OpenTelemetry SDK for one test: an in-memory reader
behind the global meter provider, set for the test and taken back after it
(as ``tests.tracing`` does with the tracer provider: the other tests run with
the API's no-op instruments, as an application without the SDK)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.metrics import _internal as api
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.util._once import Once

__all__ = ["install", "measuring", "points", "texts_of_metrics"]


def install(provider: MeterProvider | None) -> None:
    """The global provider, which the API sets once per process: replaced here."""
    api._METER_PROVIDER_SET_ONCE = Once()
    api._METER_PROVIDER = provider


@contextmanager
def measuring() -> Iterator[InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    install(provider)
    try:
        yield reader
    finally:
        provider.shutdown()
        install(None)


def _collected(reader: InMemoryMetricReader) -> list[tuple[str, str, Any]]:
    """(scope, metric name, data point) of one collection."""
    data = reader.get_metrics_data()
    if data is None:
        return []
    return [
        (scope.scope.name, metric.name, point)
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points
    ]


def points(
    reader: InMemoryMetricReader, name: str, *keys: str, scope: str | None = None
) -> dict[tuple[Any, ...], Any]:
    """The metric's points by the values of ``keys`` among their attributes:
    a counter's or gauge's value, a histogram's count of measurements."""
    found: dict[tuple[Any, ...], Any] = {}
    for scope_name, metric, point in _collected(reader):
        if metric != name or (scope is not None and scope_name != scope):
            continue
        attributes = dict(point.attributes or {})
        value = point.count if isinstance(point, HistogramDataPoint) else point.value
        at = tuple(attributes.get(k) for k in keys)
        found[at] = found.get(at, 0) + value
    return found


def texts_of_metrics(reader: InMemoryMetricReader) -> list[str]:
    """Every metric's name, attribute names and values, as text."""
    texts: list[str] = []
    for _, metric, point in _collected(reader):
        texts.append(metric)
        texts += [str(v) for item in (point.attributes or {}).items() for v in item]
    return texts
