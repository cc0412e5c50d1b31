"""The storage request duration, a histogram by operation and status, recorded
where the client spans are made (``_tracing``), so both runners give it.

OpenTelemetry's ``db.client.operation.duration``, in seconds, one measurement
per try of a request, with the span's attributes that a team groups by: the
system, account, table, operation, host, the answer's status and, for a try
that failed, its error type. Without an OpenTelemetry SDK the API's no-op
histogram records nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from opentelemetry import metrics
from opentelemetry.metrics._internal import _PROXY_METER_PROVIDER

__all__ = ["enabled", "record"]

#: The instrumentation scope of the engine's metrics (as of its spans).
SCOPE: Final = "streamstone_py"
#: The bucket boundaries the semantic conventions advise for this histogram.
_BUCKETS: Final = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0)

_made: tuple[metrics.MeterProvider, metrics.Histogram] | None = None


def _histogram() -> metrics.Histogram:
    """The histogram of the global meter provider, made again when the
    application sets another one (asked for at each use, as the tracer is)."""
    global _made
    provider = metrics.get_meter_provider()
    made = _made
    if made is None or made[0] is not provider:
        histogram = provider.get_meter(SCOPE).create_histogram(
            "db.client.operation.duration",
            unit="s",
            description="Duration of each try of a storage request",
            explicit_bucket_boundaries_advisory=_BUCKETS,
        )
        made = _made = (provider, histogram)
    return made[1]


def enabled() -> bool:
    """Whether an SDK's meter provider is set: the API's own records nothing,
    so nothing is worked out for it (the API alone costs a lookup)."""
    provider = metrics.get_meter_provider()
    return provider is not _PROXY_METER_PROVIDER and not isinstance(
        provider, metrics.NoOpMeterProvider
    )


def record(
    where: Mapping[str, Any], operation: str, status: int | None, error: str | None, seconds: float
) -> None:
    """One try's duration; ``where`` is the table's part of its span's attributes."""
    attributes = {**where, "db.operation.name": operation}
    if status is not None:
        attributes["db.response.status_code"] = str(status)
    if error is not None:
        attributes["error.type"] = error
    _histogram().record(seconds, attributes)
