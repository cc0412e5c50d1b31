"""The runtime's metrics, on the ``handlers`` meter: the processing duration of
each message a :class:`Processor` handles (``messaging.process.duration``, by
handler and outcome), and what the queue consumer counts (``_queues._metrics``).

Instruments are made on the global meter provider when first used, and made
again when the application sets another one; without an OpenTelemetry SDK the
API's no-op instruments record nothing and nothing is worked out for them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final, Generic, TypeVar

from opentelemetry import metrics
from opentelemetry.metrics._internal import _PROXY_METER_PROVIDER

__all__ = ["SCOPE", "PerProvider", "processed"]

#: The instrumentation scope of the runtime's metrics (as of its spans).
SCOPE: Final = "handlers"
#: The bucket boundaries the semantic conventions advise for durations, in seconds.
BUCKETS: Final = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0)
#: Outcome kinds that are not a message's success: their ``error.type``.
_FAILURES: Final = frozenset({"refused", "failed", "faulted"})

T = TypeVar("T")


class PerProvider(Generic[T]):
    """Instruments made by ``make`` on the global meter provider's meter of
    ``scope``; None while no SDK's provider is set (the API's records nothing)."""

    def __init__(self, scope: str, make: Callable[[metrics.Meter], T]) -> None:
        self._scope = scope
        self._make = make
        self._made: tuple[metrics.MeterProvider, T] | None = None

    def __call__(self) -> T | None:
        provider = metrics.get_meter_provider()
        if provider is _PROXY_METER_PROVIDER or isinstance(provider, metrics.NoOpMeterProvider):
            return None
        made = self._made
        if made is None or made[0] is not provider:
            # Two threads may make them at once: a provider gives both the same instruments.
            made = self._made = (provider, self._make(provider.get_meter(self._scope)))
        return made[1]


def _duration(meter: metrics.Meter) -> metrics.Histogram:
    return meter.create_histogram(
        "messaging.process.duration",
        unit="s",
        description="Duration of processing each message, its key-batch's whole",
        explicit_bucket_boundaries_advisory=BUCKETS,
    )


_durations = PerProvider(SCOPE, _duration)


def processed(handler: str, kinds: Iterable[str], seconds: float) -> None:
    """A key-batch's messages, each by its outcome's kind, processed in ``seconds``."""
    histogram = _durations()
    if histogram is None:
        return
    for kind in kinds:
        attributes = {
            "messaging.operation.name": "process",
            "streamstone.handler": handler,
            "streamstone.outcome": kind,
        }
        if kind in _FAILURES:
            attributes["error.type"] = kind
        histogram.record(seconds, attributes)
