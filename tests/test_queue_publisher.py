"""QueuePublisher against Azurite's Queue service: routes, the envelope as a
consumer reads it, the 64 KiB limit checked before a state is stored."""

from __future__ import annotations

import base64
import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.data.tables import TableClient
from azure.storage.queue import QueueClient, QueueServiceClient

from handlers import (
    MAX_QUEUE_MESSAGE_BYTES,
    HandlerContext,
    Message,
    Processor,
    QueuePublisher,
    decode_envelope,
    encode_envelope,
    handler,
)


@pytest.fixture(scope="module")
def queues(connection_string: str) -> QueueServiceClient:
    return QueueServiceClient.from_connection_string(connection_string)


@pytest.fixture
def names(queues: QueueServiceClient) -> Iterator[tuple[str, str]]:
    """Two fresh queue names, deleted after the test."""
    tag = uuid.uuid4().hex[:10]
    made = (f"scores-{tag}", f"alerts-{tag}")
    yield made
    for name in made:
        with contextlib.suppress(ResourceNotFoundError):  # a test that sent nothing there
            queues.delete_queue(name)


def received(queues: QueueServiceClient, name: str) -> list[str]:
    """Every message text on a queue, as a consumer that knows no envelope reads it."""
    queue = queues.get_queue_client(name)
    texts = []
    while batch := list(queue.receive_messages(messages_per_page=32, visibility_timeout=60)):
        for message in batch:
            texts.append(message.content)
            queue.delete_message(message)
    return texts


def test_outputs_go_to_the_queue_of_their_type_as_base64_envelopes(
    queues: QueueServiceClient, names: tuple[str, str]
) -> None:
    scores, alerts = names
    publisher = QueuePublisher(queues, {"Scored": scores, "Alarm": alerts})
    outputs = [
        Message("o-1", "game-1", "Scored", {"points": 3, "by": "ann", "ratio": 0.5}),
        Message("o-2", "game-1", "Alarm", {"text": "héllo ✓", "raw": b"\x00\xff"}, {"h": "v"}),
        Message("o-3", "game-2", "Scored", None),
    ]

    publisher.publish(outputs)
    publisher.publish(outputs[:1])  # a redelivered source sends its output again

    texts = received(queues, scores)
    assert [decode_envelope(base64.b64decode(t).decode()) for t in texts] == [
        outputs[0],
        outputs[2],
        outputs[0],
    ]
    assert base64.b64decode(texts[0]).decode() == (
        '{"body":{"by":"ann","points":3,"ratio":0.5},"headers":{},"id":"o-1",'
        '"key":"game-1","type":"Scored"}'
    )
    [alarm] = received(queues, alerts)
    assert decode_envelope(base64.b64decode(alarm).decode()) == outputs[1]


def test_a_route_function_and_a_default_queue(
    queues: QueueServiceClient, names: tuple[str, str]
) -> None:
    scores, alerts = names
    by_key = QueuePublisher(queues, lambda m: scores if m.key == "a" else alerts)
    by_key.publish([Message("x-1", "a", "T"), Message("x-2", "b", "T")])
    assert [decode_envelope(base64.b64decode(t).decode()).id for t in received(queues, scores)] == [
        "x-1"
    ]
    assert [decode_envelope(base64.b64decode(t).decode()).id for t in received(queues, alerts)] == [
        "x-2"
    ]

    fallback = QueuePublisher(queues, {"Scored": scores}, default=alerts)
    assert fallback.queue_of(Message("y", "k", "Other")) == alerts


def test_check_refuses_what_no_queue_could_take(queues: QueueServiceClient) -> None:
    publisher = QueuePublisher(queues, {"Scored": "scores", "Bad": "Not_A_Queue"})
    with pytest.raises(ValueError, match=r"no queue for output 'o' of type 'Other'"):
        publisher.check(Message("o", "k", "Other"))
    with pytest.raises(ValueError, match=r"queue name 'Not_A_Queue' for output 'o' is not valid"):
        publisher.check(Message("o", "k", "Bad"))
    with pytest.raises(ValueError, match=r"output 'o' cannot travel as JSON: Out of range float"):
        publisher.check(Message("o", "k", "Scored", {"x": float("nan")}))
    with pytest.raises(ValueError, match="comes twice with different content"):
        publisher.publish([Message("o", "k", "Scored", 1), Message("o", "k", "Scored", 2)])


def _body_of_size(size: int) -> str:
    """A body whose envelope makes a queue message of exactly ``size`` bytes as sent."""
    empty = len(encode_envelope(Message("edge", "k", "Scored", "")).encode())
    raw = size * 3 // 4  # base64 makes 4 bytes of every 3
    return "x" * (raw - empty)


def test_the_largest_message_that_fits_is_sent_and_one_more_is_refused_before_sending(
    connection_string: str, queues: QueueServiceClient, names: tuple[str, str]
) -> None:
    scores, _ = names
    publisher = QueuePublisher(queues, {"Scored": scores})
    fits = Message("edge", "k", "Scored", _body_of_size(MAX_QUEUE_MESSAGE_BYTES))
    assert len(base64.b64encode(encode_envelope(fits).encode())) == MAX_QUEUE_MESSAGE_BYTES

    publisher.publish([fits])
    [text] = received(queues, scores)
    assert decode_envelope(base64.b64decode(text).decode()) == fits

    over = Message("edge", "k", "Scored", _body_of_size(MAX_QUEUE_MESSAGE_BYTES) + "xxx")
    with pytest.raises(ValueError, match=r"is 65540 bytes as a queue message; a queue message "):
        publisher.check(over)
    # The limit is the service's: sent anyway, the queue refuses it.
    raw = QueueClient.from_connection_string(connection_string, scores)
    with pytest.raises(HttpResponseError):
        raw.send_message(base64.b64encode(encode_envelope(over).encode()).decode())


@dataclass
class Tally:
    count: int = 0


@handler("Shouter", Tally, types=["Shout"])
def shouter(state: Tally, message: Message, ctx: HandlerContext) -> None:
    state.count += 1
    ctx.publish("Shouted", {"text": message.body["text"], "count": state.count})


def test_an_output_over_the_limit_abandons_its_message_alone_before_its_state_is_stored(
    table: TableClient, queues: QueueServiceClient, names: tuple[str, str]
) -> None:
    scores, _ = names
    processor = Processor(shouter, table, QueuePublisher(queues, {"Shouted": scores}))
    key = f"shouts-{uuid.uuid4().hex[:8]}"
    big = "y" * MAX_QUEUE_MESSAGE_BYTES

    outcomes = processor.process_batch(
        key,
        [
            Message("s-1", key, "Shout", {"text": "hi"}),
            Message("s-2", key, "Shout", {"text": big}),
            Message("s-3", key, "Shout", {"text": "again"}),
        ],
    )

    assert [(o.message_id, o.status, o.version) for o in outcomes] == [
        ("s-1", "completed", 1),
        ("s-2", "abandoned", None),
        ("s-3", "completed", 2),
    ]
    assert "as a queue message; a queue message holds at most 65536" in str(outcomes[1].reason)
    assert processor.current_state(key).state == Tally(2)
    bodies = [decode_envelope(base64.b64decode(t).decode()).body for t in received(queues, scores)]
    assert bodies == [{"count": 1, "text": "hi"}, {"count": 2, "text": "again"}]
