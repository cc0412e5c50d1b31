"""The spans of a key's batch: one per message processed, the batch's own,
and one per output published.

Each message's span is a child of the context its headers carry (the
current one without), so a message's trace runs from its sender through its
processing. The batch reads and writes once for all its messages: its span
(and the storage requests' under it) is a child of its first message's span,
linked to the others'. An output goes out carrying the context of its
publish span, a child of the span of the message that produced it; the
outcome keeps the output as the handler made it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Final

from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind, StatusCode

from .._messages._message import Message
from .._messages._metrics import processed
from .._messages._tracing import (
    TraceContext,
    carrying,
    failed,
    message_attributes,
    origin,
    tracer,
)
from .._outcome import Outcome, Step

__all__ = ["BatchSpans", "processing"]

#: Outcome kinds that are not a message's success.
_FAILURES: Final = frozenset({"refused", "failed", "faulted"})


class BatchSpans:
    """A batch's message spans, told their outcomes, and its publish spans."""

    def __init__(self, handler: str, spans: dict[int, Span], batch: Span) -> None:
        self.handler = handler
        self._spans = spans  # by the id() of the message object each was made for
        self._batch = batch
        #: The outcomes told, each message's processing duration measured by.
        self.told: list[Outcome] = []

    def _of(self, message: Message) -> Span:
        return self._spans.get(id(message), self._batch)

    @contextmanager
    def publishing(
        self, steps: Sequence[Step], check: Callable[[Message], None] | None = None
    ) -> Iterator[list[Message]]:
        """The steps' outputs, each carrying the context of its own publish span
        as far as the publisher's ``check`` lets it (see ``carrying``), the
        spans ended once the block is done, failed if it raises."""
        spans: list[Span] = []
        outputs: list[Message] = []
        try:
            for step in steps:
                source = self._of(step.message)
                parent = trace.set_span_in_context(source)
                for output in step.outputs:
                    span = tracer().start_span(
                        f"publish {self.handler}", context=parent, kind=SpanKind.PRODUCER
                    )
                    spans.append(span)
                    if span.is_recording():
                        span.set_attributes(message_attributes(output))
                        span.set_attributes(
                            {
                                "messaging.operation.type": "send",
                                "streamstone.handler": self.handler,
                            }
                        )
                    # The API alone makes no span: it hands back the parent's
                    # context (a sender's), and no header is added without an SDK.
                    made = span.get_span_context() != source.get_span_context()
                    outputs.append(carrying(output, span, check) if made else output)
            yield outputs
        except BaseException as exc:
            for span in spans:
                failed(span, exc)
            raise
        finally:
            for span in spans:
                span.end()

    def tell(self, outcomes: Sequence[Outcome]) -> None:
        self.told.extend(outcomes)
        for outcome in outcomes:
            span = self._of(outcome.message)
            if not span.is_recording() or span is self._batch:
                continue
            span.set_attribute("streamstone.outcome", outcome.kind)
            span.set_attribute("streamstone.duplicate", outcome.status == "duplicate")
            span.set_attribute("streamstone.outputs", len(outcome.outputs))
            if outcome.version is not None:
                span.set_attribute("streamstone.version", outcome.version)
            if outcome.kind in _FAILURES:
                span.set_attribute("error.type", outcome.kind)
                span.set_status(StatusCode.ERROR)


@contextmanager
def processing(
    handler: str, key: str, messages: Sequence[Message], trace_context: TraceContext = "parent"
) -> Iterator[BatchSpans]:
    """The spans of a key's batch, the batch's current while the block runs;
    each message's a child of its input's context, or linked to it."""
    started = time.perf_counter()
    made = tracer()
    spans: dict[int, Span] = {}
    for message in messages:
        if id(message) in spans:
            continue
        parent, links = origin(message, trace_context)
        span = made.start_span(
            f"process {handler}", context=parent, kind=SpanKind.CONSUMER, links=links
        )
        if span.is_recording():
            span.set_attributes(message_attributes(message))
            span.set_attributes(
                {"messaging.operation.type": "process", "streamstone.handler": handler}
            )
        spans[id(message)] = span
    first = next(iter(spans.values()), None)
    batch = made.start_span(
        f"process_batch {handler}",
        context=trace.set_span_in_context(first) if first is not None else None,
        kind=SpanKind.INTERNAL,
        links=[Link(s.get_span_context()) for s in list(spans.values())[1:]],
        attributes={
            "streamstone.handler": handler,
            "streamstone.message.key": key,
            "messaging.batch.message_count": len(messages),
        },
    )
    spanned = BatchSpans(handler, spans, batch)
    try:
        with trace.use_span(batch, end_on_exit=False, record_exception=False,
                            set_status_on_exception=False):  # fmt: skip
            yield spanned
    except BaseException as exc:
        for span in (batch, *spans.values()):
            failed(span, exc)
        raise
    finally:
        batch.end()
        for span in spans.values():
            span.end()
        # Each message's processing lasts its batch's: the batch reads, writes
        # and publishes once for all of them.
        processed(handler, (o.kind for o in spanned.told), time.perf_counter() - started)
