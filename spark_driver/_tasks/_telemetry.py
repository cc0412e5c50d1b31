"""OpenTelemetry's SDK set up from the standard ``OTEL_*`` environment
variables, on the driver and in every Python worker, when any is set.

Each process reads its own environment: on a cluster the executors' come
from ``spark.executorEnv.OTEL_...`` (they may hold a collector's key in
``OTEL_EXPORTER_OTLP_HEADERS``, so the driver never ships its own in a task).
Spans and metrics go over OTLP/HTTP (``http/protobuf``) to
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the per-signal endpoints), batched; the
SDK reads the rest itself (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``, ``OTEL_METRIC_EXPORT_INTERVAL``...).
``OTEL_TRACES_EXPORTER`` and ``OTEL_METRICS_EXPORTER`` may say ``otlp`` (the
default), ``console`` or ``none``; ``OTEL_SDK_DISABLED=true`` turns it all off.

Nothing is done when no ``OTEL_*`` variable is set, nor where the process
already has a tracer provider (the application's). The SDK and the exporter
are the ``otel`` extra: with ``OTEL_*`` set and either missing, the job stops
with an error naming the package.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Final

from opentelemetry import metrics, trace

from handlers._messages._metrics import PerProvider

from ._export_health import Health, watched_metrics, watched_spans

__all__ = ["configure", "counted", "flush", "wanted"]

_log = logging.getLogger(__name__)

#: The modules needed, by the package that brings each.
_PACKAGES: Final = {
    "opentelemetry.sdk": "opentelemetry-sdk",
    "opentelemetry.exporter.otlp.proto.http": "opentelemetry-exporter-otlp-proto-http",
}
_PROTOCOL: Final = "http/protobuf"
#: How long a task's end waits for its spans and metrics to go out, in ms.
_FLUSH_MILLIS: Final = 10_000

_lock = threading.Lock()
#: Whether this process's OTLP exports reach the collector.
_health = Health()
#: What this process set up: the providers to flush at each task's end.
_providers: list[Any] = []


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment asks for OpenTelemetry: an ``OTEL_*`` variable
    is set, and ``OTEL_SDK_DISABLED`` is not ``true``."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(name.startswith("OTEL_") for name in environ)


def _exporters(signal: str, environ: Mapping[str, str]) -> list[str]:
    """The exporters ``OTEL_<SIGNAL>_EXPORTER`` names, each one this job knows."""
    variable = f"OTEL_{signal.upper()}_EXPORTER"
    names = [n.strip() for n in environ.get(variable, "otlp").split(",") if n.strip()]
    for name in names:
        if name not in ("otlp", "console", "none"):
            raise ValueError(f"{variable}={name!r}: the job exports with 'otlp' (over HTTP), "
                             "'console' or 'none'")  # fmt: skip
    protocol_variables = (f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL",
                          "OTEL_EXPORTER_OTLP_PROTOCOL")  # fmt: skip
    for protocol_variable in protocol_variables:
        protocol = environ.get(protocol_variable)
        if protocol is not None and "otlp" in names:
            if protocol.strip() != _PROTOCOL:
                raise ValueError(f"{protocol_variable}={protocol!r}: the job sends OTLP over "
                                 f"HTTP only ({_PROTOCOL!r})")  # fmt: skip
            break  # the signal's own variable wins over the general one
    return [n for n in names if n != "none"]


def _meter_provider_unset() -> bool:
    from opentelemetry.metrics._internal import _PROXY_METER_PROVIDER

    return metrics.get_meter_provider() is _PROXY_METER_PROVIDER


def _imported() -> None:
    """Each module needed, or an ImportError naming the package to install."""
    for module, package in _PACKAGES.items():
        try:
            importlib.import_module(module)
        except ImportError as exc:
            set_ = sorted(n for n in os.environ if n.startswith("OTEL_"))
            raise ImportError(
                f"{', '.join(set_)} set, but {package} is not installed (it cannot import "
                f"{exc.name or module!r}): install streamstone-py[otel], or unset the OTEL_ "
                "variables"
            ) from exc


def configure() -> bool:
    """Set up the SDK in this process from its ``OTEL_*`` variables, once;
    whether this process exports through it."""
    with _lock:
        if _providers:
            return True
        if not wanted():
            return False
        traces, measures = _exporters("traces", os.environ), _exporters("metrics", os.environ)
        # A provider the application set stays: this sets up only what it has not.
        if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            traces = []
        if not _meter_provider_unset():
            measures = []
        if not traces and not measures:
            return False
        _imported()
        _providers.extend(_set_up(traces, measures))
        return bool(_providers)


def _set_up(traces: list[str], measures: list[str]) -> list[Any]:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    made: list[Any] = []
    if traces:
        tracer_provider = TracerProvider(resource=resource)
        for name in traces:
            exporter = (
                watched_spans(OTLPSpanExporter(), _health)
                if name == "otlp"
                else ConsoleSpanExporter()
            )
            tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(tracer_provider)
        made.append(tracer_provider)
    if measures:
        readers = [
            PeriodicExportingMetricReader(
                watched_metrics(OTLPMetricExporter(), _health)
                if name == "otlp"
                else ConsoleMetricExporter()
            )
            for name in measures
        ]
        meter_provider = MeterProvider(metric_readers=readers, resource=resource)
        metrics.set_meter_provider(meter_provider)
        made.append(meter_provider)
    signals = (("traces", traces), ("metrics", measures))
    exported = [f"{s} by {'+'.join(n)}" for s, n in signals if n]
    _log.info("OpenTelemetry: process %d exports %s", os.getpid(), ", ".join(exported))
    return made


def flush() -> None:
    """Send what this process recorded (at a task's end: a Python worker may
    be ended without notice once idle, its batches unsent), within one
    deadline; not while the collector is down (see ``_export_health``)."""
    deadline = time.monotonic() + _FLUSH_MILLIS / 1000
    for provider in list(_providers):
        left = deadline - time.monotonic()
        if _health.down() or left <= 0:
            return
        provider.force_flush(int(left * 1000))


def _counter(meter: metrics.Meter) -> metrics.Counter:
    return meter.create_counter(
        "streamstone.messages", unit="{message}", description="Messages settled, by outcome"
    )


#: The instrumentation scope of the job's own metrics.
SCOPE: Final = "spark_driver"
_messages = PerProvider(SCOPE, _counter)


def counted(outcomes: Iterable[str], **attributes: str) -> None:
    """Messages by outcome (``completed``, ``duplicate``, ``abandoned``,
    ``faulted``, ``dead_lettered``, ``poisoned``), each task attempt's: a
    task Spark runs again counts its messages again."""
    counter = _messages()
    if counter is None:
        return
    for outcome, n in Counter(outcomes).items():
        counter.add(n, {**attributes, "streamstone.outcome": outcome})
