"""Trace headers against what an application and its senders really do: a
sender's tracestate as long as W3C allows, trace headers that do not read,
the application's own propagators and baggage, versions stored before trace
headers were left out of an output's identity. A message is never shelved,
and an output never changed, for how it travelled."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.data.tables import TableClient, UpdateMode
from azure.storage.queue import QueueClient, QueueServiceClient
from opentelemetry import baggage, context, propagate
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from handlers import (
    MAX_QUEUE_MESSAGE_BYTES,
    HandlerContext,
    InMemoryPublisher,
    Message,
    Processor,
    QueueConsumer,
    QueuePublisher,
    encode_envelope,
    handler,
    read_queue_text,
)
from handlers._messages._codec import digest, pack
from tests.helpers import drain
from tests.queueing import Tally, add, poison_of, send, states, tally
from tests.test_tracing_messages import _traceparent, _under, echo

#: A tracestate as long as W3C Trace Context and the API take (32 members, 8,192
#: characters; a 256-character value each would be 8 KiB more, which the API drops).
LONGEST_TRACESTATE = ",".join(f"k{i:02d}={'v' * 251}" for i in range(32))

_TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


@handler("Grow", Tally, types=["Add"])
def grow(state: Tally, message: Message, ctx: HandlerContext) -> None:
    """An output as large as its input asks: ``pad`` characters of body."""
    state.total += message.body["n"]
    state.seen.append(message.id)
    ctx.publish("Grown", {"pad": "x" * message.body["pad"]}, id=f"{message.id}-grown")


def _queue_bytes(message: Message) -> int:
    return 4 * ((len(encode_envelope(message).encode("utf-8")) + 2) // 3)


def _pad_short_of_the_limit(key: str, room: int) -> int:
    """The pad that makes ``grow``'s output ``room`` bytes short of a queue message's limit."""

    def output(pad: int) -> Message:
        return Message("m-1-grown", key, "Grown", {"pad": "x" * pad}, produced=datetime.now(UTC))

    base = _queue_bytes(output(0))
    pad = (MAX_QUEUE_MESSAGE_BYTES - room - base) * 3 // 4
    assert (
        MAX_QUEUE_MESSAGE_BYTES - room - 8
        < _queue_bytes(output(pad))
        <= (MAX_QUEUE_MESSAGE_BYTES - room)
    )
    return pad


def test_a_sender_s_longest_tracestate_never_keeps_an_output_from_its_queue(
    table: TableClient, queues: QueueServiceClient, queue: QueueClient, spans: InMemorySpanExporter
) -> None:
    traceparent, trace_id, _ = _traceparent()
    headers = {"traceparent": traceparent, "tracestate": LONGEST_TRACESTATE}
    taken = get_current_span(TraceContextTextMapPropagator().extract(headers))
    assert len(taken.get_span_context().trace_state) == 32  # the API takes it whole
    out = f"{queue.queue_name}-out"
    queues.create_queue(out)
    key = f"k-{uuid.uuid4().hex[:8]}"
    pad = _pad_short_of_the_limit(key, room=256)  # fits, as the publisher checked it
    send(queue, Message("m-1", key, "Add", {"n": 2, "pad": pad}, headers))
    processor = Processor(grow, table, QueuePublisher(queues, lambda m: out))
    consumer = QueueConsumer(processor, queue, max_dequeue_count=2, backoff=timedelta(0))

    stats = consumer.run(until_empty=True)

    assert (stats.received, stats.completed, stats.poisoned) == (1, 1, 0)
    assert poison_of(queues, queue) == []
    assert states(processor, key) == {key: (1, Tally(2, ["m-1"]))}
    (output,) = [read_queue_text(t) for t in drain(queues.get_queue_client(out))]
    assert output.identity() == Message("m-1-grown", key, "Grown", {"pad": "x" * pad}).identity()
    # In its trace still: the traceparent fits where the sender's tracestate did not.
    (publish,) = [s for s in spans.get_finished_spans() if s.name == "publish Grow"]
    assert dict(output.headers) == {
        "traceparent": f"00-{trace_id:032x}-{publish.context.span_id:016x}-01"
    }


def test_the_application_s_baggage_never_goes_into_an_output(
    table: TableClient, spans: InMemorySpanExporter
) -> None:
    publisher = InMemoryPublisher()
    processor = Processor(tally, table, publisher)
    key = f"k-{uuid.uuid4().hex[:8]}"
    traceparent, _, _ = _traceparent()
    message = _under(add(1, key, 2), traceparent)
    before = propagate.get_global_textmap()
    # The API's default propagators, named: W3C Trace Context and W3C Baggage.
    propagate.set_global_textmap(
        CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
    )
    try:
        for request in ("r-1", "r-2"):  # the same command, sent by two requests of a web app
            token = context.attach(baggage.set_baggage("request", request))
            try:
                processor.process(message)
            finally:
                context.detach(token)
    finally:
        propagate.set_global_textmap(before)

    assert [sorted(o.headers) for o in publisher.deliveries] == [["traceparent"]] * 2
    assert publisher.divergent == []
    assert states(processor, key) == {key: (1, Tally(2, ["m-1"]))}


def test_a_duplicate_of_a_version_stored_before_trace_headers_left_identity_replays(
    table: TableClient,
) -> None:
    """A handler that passes its input's headers on, a version stored by the
    runtime before this change (its digest of the outputs' whole encoding,
    trace headers in), and the queue's copy of that message again."""
    processor = Processor(echo, table, InMemoryPublisher())
    key = f"k-{uuid.uuid4().hex[:8]}"
    traceparent, _, _ = _traceparent()
    message = _under(add(1, key, 2), traceparent)
    first = processor.process(message)
    entity = table.get_entity(key, "Echo|SS-SE-0000000001")
    entity["Digest"] = digest(pack([o.encode() for o in first.outputs]))
    table.update_entity(entity, mode=UpdateMode.REPLACE)

    again = processor.process(message)

    assert (first.status, again.status, again.version) == ("completed", "duplicate", 1)
    assert [o.encode() for o in again.outputs] == [o.encode() for o in first.outputs]
    assert [dict(o.headers) for o in again.outputs] == [{"traceparent": traceparent}]
    assert states(processor, key) == {key: (1, Tally(2, ["m-1"]))}


def test_without_an_sdk_an_input_s_trace_is_not_added_to_its_outputs(table: TableClient) -> None:
    publisher = InMemoryPublisher()
    key = f"k-{uuid.uuid4().hex[:8]}"
    traceparent, _, _ = _traceparent()
    message = Message("m-1", key, "Add", {"n": 2},
                      {"traceparent": traceparent, "tracestate": "vendor=7"})  # fmt: skip

    outcome = Processor(tally, table, publisher).process(message)

    assert outcome.status == "completed"
    assert [dict(o.headers) for o in publisher.deliveries] == [{}]


#: Trace headers that do not read (W3C Trace Context), each on a message of its own.
_UNREADABLE = {
    "version-ff": {"traceparent": "ff-" + "1" * 32 + "-" + "2" * 16 + "-01"},
    "zero-trace": {"traceparent": "00-" + "0" * 32 + "-" + "2" * 16 + "-01"},
    "zero-span": {"traceparent": "00-" + "1" * 32 + "-" + "0" * 16 + "-01"},
    "upper-hex": {"traceparent": "00-" + "A" * 32 + "-" + "B" * 16 + "-01"},
    "v00-more": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01-more"},
    "garbage": {"traceparent": "not a trace"},
    "non-ascii": {"traceparent": "00-" + "é" * 32 + "-" + "2" * 16 + "-01"},
    "huge": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01" + "-x" * 10_000},
    "empty": {"traceparent": ""},
}
#: Readable traceparents beside tracestates that do not read, or names in other cases.
_ODD = {
    "dup-keys": {"tracestate": "a=1,a=2"},
    "bad-member": {"tracestate": "a=1,B=é"},
    "33-members": {"tracestate": ",".join(f"m{i}=v" for i in range(33))},
    "long-value": {"tracestate": "a=" + "v" * 10_000},
    "upper-name": {"TraceParent": "00-" + "3" * 32 + "-" + "4" * 16 + "-01"},
}


def _receives(spans: InMemorySpanExporter) -> dict[str, tuple[int, int] | None]:
    """The (trace id, span id) of each message's receive span, by message id."""
    return {
        str(dict(s.attributes or {})["messaging.message.id"]): _ids(s.context)
        for s in spans.get_finished_spans()
        if s.name.startswith("receive ")
    }


def _ids(context: Any) -> tuple[int, int] | None:
    return None if context is None else (context.trace_id, context.span_id)


def test_trace_headers_that_do_not_read_never_stop_a_message(
    table: TableClient, queue: QueueClient, queues: QueueServiceClient, spans: InMemorySpanExporter
) -> None:
    publisher = InMemoryPublisher()
    processor = Processor(tally, table, publisher)
    tag = uuid.uuid4().hex[:6]
    sent: dict[str, Message] = {}
    for name, headers in [*_UNREADABLE.items(), *_ODD.items()]:
        traceparent, _, _ = _traceparent()
        readable = {"traceparent": traceparent} if name in _ODD else {}
        sent[name] = Message(f"m-{name}", f"{tag}-{name}", "Add", {"n": 2},
                             {**readable, **headers})  # fmt: skip
        send(queue, sent[name])

    stats = QueueConsumer(processor, queue, backoff=timedelta(0)).run(until_empty=True)

    assert (stats.received, stats.completed, stats.poisoned) == (len(sent), len(sent), 0)
    assert poison_of(queues, queue) == []
    keys = [m.key for m in sent.values()]
    assert states(processor, *keys) == {m.key: (1, Tally(2, [m.id])) for m in sent.values()}
    assert sorted(o.key for o in publisher.deliveries) == sorted(keys)
    for output in publisher.deliveries:  # each in a trace of its own, or its sender's
        assert sorted(output.headers) in (["traceparent"], ["traceparent", "tracestate"])
        assert _TRACEPARENT.fullmatch(output.headers["traceparent"]), output.headers
    parents = {
        str(dict(s.attributes or {})["messaging.message.id"]): s.parent
        for s in spans.get_finished_spans()
        if s.name == "process Tally"
    }
    # No parent read from them: each is processed in its own receive's trace.
    receives = _receives(spans)
    mine = {m for m in parents if _ids(parents[m]) == receives[m]}
    assert mine == {f"m-{n}" for n in _UNREADABLE}
    for name in ("dup-keys", "long-value"):  # a tracestate that does not read is left behind
        (output,) = [o for o in publisher.deliveries if o.key == sent[name].key]
        assert "tracestate" not in output.headers


def test_trace_headers_that_are_not_text_never_shelve_a_message(
    table: TableClient, queue: QueueClient, queues: QueueServiceClient, spans: InMemorySpanExporter
) -> None:
    """JSON may carry what no header can hold: a lone surrogate (escaped), a
    number, a null, a list. In a trace header that is how the message
    travelled, not what it is: left behind, the message processed; in any
    other header it is the message's, which is refused as before."""
    traceparent, trace_id, _ = _traceparent()
    tag = uuid.uuid4().hex[:6]
    odd: dict[str, dict[str, object]] = {
        "lone-parent": {"traceparent": "\ud800"},
        "lone-state": {"traceparent": traceparent, "tracestate": "a=\udc00"},
        "number": {"traceparent": 5, "tracestate": None},
        "list": {"TraceParent": [traceparent], "other": "kept"},
        "lone-other": {"traceparent": traceparent, "other": "\ud800"},
    }
    for name, headers in odd.items():
        envelope = {"id": f"m-{name}", "key": f"{tag}-{name}", "type": "Add", "body": {"n": 2},
                    "headers": headers}  # fmt: skip
        queue.send_message(json.dumps(envelope))  # escaped: \ud800 as JSON writes it
    processor = Processor(tally, table, InMemoryPublisher())
    consumer = QueueConsumer(processor, queue, max_dequeue_count=1, backoff=timedelta(0))

    stats = consumer.run(until_empty=True)

    assert (stats.received, stats.completed, stats.poisoned) == (5, 4, 1)
    assert [e.reason for e in poison_of(queues, queue)] == [
        "not a message envelope: message header 'other' is not UTF-8 text (surrogates not allowed)"
    ]
    kept = [n for n in odd if n != "lone-other"]
    assert states(processor, *[f"{tag}-{n}" for n in kept]) == {
        f"{tag}-{n}": (1, Tally(2, [f"m-{n}"])) for n in kept
    }
    processed = {
        str(dict(s.attributes or {})["messaging.message.id"]): s
        for s in spans.get_finished_spans()
        if s.name == "process Tally"
    }
    assert sorted(processed) == sorted(f"m-{n}" for n in kept)
    receives = _receives(spans)
    (sender_s,) = [m for m, s in processed.items() if _ids(s.parent) != receives[m]]
    assert (sender_s, processed[sender_s].context.trace_id) == ("m-lone-state", trace_id)
