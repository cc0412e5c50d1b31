"""Whether this process's exports reach their collector: each OTLP exporter
wrapped so that its last result is known. A task's end waits for its spans
and metrics only while the collector answers, so a collector that is down
costs a Python worker one export timeout per quiet period, not one per task
(the SDK's own threads keep exporting on their schedule meanwhile)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, Final

__all__ = ["QUIET_SECONDS", "Health", "watched_metrics", "watched_spans"]

#: How long after a failed export a task's end does not wait for the next.
QUIET_SECONDS: Final = 60.0


class Health:
    """When an export of this process last failed (None: the last one went out)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failed_at: float | None = None

    def note(self, ok: bool) -> None:
        with self._lock:
            self._failed_at = None if ok else time.monotonic()

    def down(self) -> bool:
        """Whether an export failed within the last :data:`QUIET_SECONDS`."""
        with self._lock:
            failed_at = self._failed_at
        return failed_at is not None and time.monotonic() - failed_at < QUIET_SECONDS


def watched_spans(inner: Any, health: Health) -> Any:
    """``inner``, a span exporter, telling ``health`` how each export went."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class Watched(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            result: SpanExportResult = inner.export(spans)
            health.note(result is SpanExportResult.SUCCESS)
            return result

        def shutdown(self) -> None:
            inner.shutdown()

        def force_flush(self, timeout_millis: int = 30_000) -> bool:
            return bool(inner.force_flush(timeout_millis))

    return Watched()


def watched_metrics(inner: Any, health: Health) -> Any:
    """``inner``, a metric exporter, telling ``health`` how each export went."""
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

    class Watched(MetricExporter):
        def __init__(self) -> None:
            super().__init__(
                preferred_temporality=inner._preferred_temporality,
                preferred_aggregation=inner._preferred_aggregation,
            )

        def export(
            self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any
        ) -> MetricExportResult:
            result: MetricExportResult = inner.export(
                metrics_data, timeout_millis=timeout_millis, **kwargs
            )
            health.note(result is MetricExportResult.SUCCESS)
            return result

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return bool(inner.force_flush(timeout_millis))

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            inner.shutdown(timeout_millis=timeout_millis, **kwargs)

    return Watched()
