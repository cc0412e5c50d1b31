"""The chaos run with tracing on: the OpenTelemetry SDK behind every worker
(threads share the coordinator's provider, processes install their own), and
each delivery of a message under a trace of its own, as a broker's copies of
one message would come from different attempts of their sender."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.sdk.trace import TracerProvider

from handlers import Message

from ..tracing import install

__all__ = ["delivered", "install", "traced"]


@contextmanager
def traced(on: bool) -> Iterator[None]:
    """Spans recorded in this process while the block runs, when ``on``. No
    exporter: a sampled span is what makes an output carry its context."""
    if not on:
        yield
        return
    provider = TracerProvider()
    install(provider)
    try:
        yield
    finally:
        provider.shutdown()
        install(None)


def delivered(message: Message, draw: random.Random) -> Message:
    """A copy of ``message`` whose headers put it in a fresh trace."""
    trace_id = f"{draw.getrandbits(128) or 1:032x}"
    span_id = f"{draw.getrandbits(64) or 1:016x}"
    headers = {**message.headers, "traceparent": f"00-{trace_id}-{span_id}-01"}
    return Message(message.id, message.key, message.type, message.body, headers, message.due)
