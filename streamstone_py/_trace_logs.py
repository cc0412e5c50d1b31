"""Trace ids in log records: a logging filter the application puts on its
handlers, as :class:`RedactSecrets` is put.

A library does not change how the application logs: a record factory
(``logging.setLogRecordFactory``) is one for the whole process, and
OpenTelemetry's own logging instrumentation installs one when the
application asks for it. A handler's filter sees the records of every
logger below it, the packages' and any other library's, so each record
that reaches the handler has the fields, and a format that names them never
fails on one that lacks them.
"""

from __future__ import annotations

import logging
from typing import Final

from opentelemetry import trace

__all__ = ["TraceIds"]

#: The fields' values on a record made while no span is active.
_NO_TRACE: Final = "0"


class TraceIds(logging.Filter):
    """Sets ``otelTraceID`` and ``otelSpanID`` (hex, as in a ``traceparent``)
    and ``otelTraceSampled`` on every record it passes, from the span current
    where the record was made; ``"0"`` and ``False`` when none is. The names
    are those of OpenTelemetry's logging instrumentation, so a format written
    for it reads the same::

        handler.addFilter(TraceIds())
        handler.setFormatter(logging.Formatter(
            "%(levelname)s trace=%(otelTraceID)s span=%(otelSpanID)s %(message)s"))

    Filters run where the record is handled, in the thread that logged it,
    so the current span is the one that thread had.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        ids: dict[str, object]
        if context.is_valid:
            ids = {
                "otelTraceID": format(context.trace_id, "032x"),
                "otelSpanID": format(context.span_id, "016x"),
                "otelTraceSampled": context.trace_flags.sampled,
            }
        else:
            ids = {"otelTraceID": _NO_TRACE, "otelSpanID": _NO_TRACE, "otelTraceSampled": False}
        vars(record).update(ids)  # fields a record has no type for
        return True
