"""Why a Spark read failed, as the driver tells it: the innermost error of
Spark's chain of causes as one line, the whole text with the JVM's stack
traces, and whether the failure looks like the storage out of reach rather
than the file's fault."""

from __future__ import annotations

import re
from typing import Any, Final

from pyspark.sql import SparkSession

__all__ = ["OUTAGE", "failure_reason", "whole_text"]

#: A read that failed because the storage could not be reached, not because of
#: the file: the stream stops (to be run again) instead of refusing the file.
OUTAGE: Final = re.compile(
    r"java\.net\.|SocketTimeout|ConnectException|UnknownHost|Connection (reset|refused)"
    r"|timed out|Throttl|ServerBusy|Service ?Unavailable",
    re.IGNORECASE,
)


def _java(exc: BaseException) -> Any:
    """The JVM's exception behind a PySpark one, if any."""
    return getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)


def whole_text(spark: SparkSession, exc: BaseException) -> str:
    """An error's message with its JVM stack traces, causes and the failed
    tasks' included (PySpark may show only the first line)."""
    java = _java(exc)
    if java is None:
        return str(exc)
    jvm: Any = spark.sparkContext._jvm
    return str(jvm.org.apache.commons.lang3.exception.ExceptionUtils.getStackTrace(java))


def failure_reason(exc: BaseException) -> str:
    """The innermost error with a message in Spark's chain of causes (the one
    that says what is wrong with the file), as one line."""
    java = _java(exc)
    reason = None
    while java is not None:
        message = java.getMessage()
        if message:
            name = str(java.getClass().getSimpleName())
            reason = f"{name}: {' '.join(str(message).split())}"
        java = java.getCause()
    if reason is None:
        lines = str(exc).strip().splitlines()
        reason = lines[0] if lines else type(exc).__name__
    return reason if len(reason) <= 500 else reason[:500] + "..."
