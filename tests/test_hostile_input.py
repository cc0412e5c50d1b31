"""Hostile input: every key, id, body and state is either stored and read back
exactly, or refused with a clear error before anything is written, and no
input ever touches another key's stream."""

from __future__ import annotations

import json
import uuid
from typing import Any

import msgpack
import pytest
from azure.data.tables import TableClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handlers import InMemoryPublisher, Message, Processor, StateTooLargeError, handler
from handlers.examples import shooting_range
from streamstone_py import EventData, Partition, Stream
from tests.helpers import register_raw, rows

SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

# Text that leans on what breaks stores: separators, reserved characters, controls, astral planes.
hostile_text = st.text(
    alphabet=st.one_of(
        st.sampled_from(list("|/\\#?'\"%&*:;<>{}[] \t\n\x00\x7f\x85-_.~")),
        st.characters(codec="utf-8"),
    ),
    max_size=40,
) | st.sampled_from(["", "SS-HEAD", "victim|SS-HEAD", "|", "a" * 600, "😀" * 300, "..", "."])


@pytest.fixture(scope="module")
def victim(table: TableClient) -> tuple[Partition, dict[str, Any]]:
    """A stream that no hostile input may change."""
    register_raw(table)
    partition = Partition(table, "victim-" + uuid.uuid4().hex)
    Stream.write(Stream(partition, {"Owner": "victim"}), EventData(id="v1", properties={"N": 1}))
    return partition, rows(partition)


@SETTINGS
@given(key=hostile_text, event_id=hostile_text, value=hostile_text)
def test_keys_and_ids_are_stored_exactly_or_refused(
    table: TableClient,
    victim: tuple[Partition, dict[str, Any]],
    key: str,
    event_id: str,
    value: str,
) -> None:
    refused: Exception | None = None
    partition: Partition | None = None
    try:
        partition = Partition(table, f"h-{uuid.uuid4().hex[:6]}-{key}")
        event = EventData(id=event_id or None, properties={"Value": value})
        Stream.write(Stream(partition), event)
    except (ValueError, TypeError) as exc:  # refused before anything was sent
        refused = exc
    if refused is not None:
        assert str(refused)  # a message that names the problem
        assert partition is None or rows(partition) == {}  # nothing was written
        assert rows(victim[0]) == victim[1]
        return
    assert partition is not None
    (stored,) = Stream.read(partition).events
    assert (stored.id, stored.properties) == (event_id or None, {"Value": value})
    assert rows(victim[0]) == victim[1]


@SETTINGS
@given(key=hostile_text)
def test_a_crafted_key_never_reaches_another_handlers_stream(
    table: TableClient, victim: tuple[Partition, dict[str, Any]], key: str
) -> None:
    processor = Processor(shooting_range, table, InMemoryPublisher())
    target = f"{victim[0].partition_key}|{key}"
    with pytest.raises((ValueError, TypeError)):
        processor.process(Message("m-1", target, "StartNewRound"))
    assert rows(victim[0]) == victim[1]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=40,
)


@SETTINGS
@given(body=json_values)
def test_message_bodies_round_trip_exactly(body: Any) -> None:
    message = Message("m", "k", "T", body)
    assert Message.decode(message.encode()) == message


@SETTINGS
@given(
    value=st.integers(2**64, 2**200) | st.integers(-(2**200), -(2**63) - 1),
    wrap=st.sampled_from(["bare", "list", "map"]),
)
def test_integers_outside_msgpack_range_are_refused_with_the_path(value: int, wrap: str) -> None:
    body = {"bare": value, "list": [1, value], "map": {"a": {"position": value}}}[wrap]
    with pytest.raises(ValueError, match=f"is the integer {value}, outside msgpack's range"):
        Message("m", "k", "T", body)


@SETTINGS
@given(data=st.binary(max_size=200))
def test_garbage_never_decodes_into_a_message_silently(data: bytes) -> None:
    try:
        decoded: Message | ValueError = Message.decode(data)
    except ValueError as exc:
        decoded = exc
    if isinstance(decoded, ValueError):
        assert "not an encoded message" in str(decoded)
    else:
        assert decoded.encode() == msgpack.packb(msgpack.unpackb(data), use_bin_type=True)


def test_deeply_nested_and_huge_bodies(table: TableClient) -> None:
    nested: Any = "leaf"
    for _ in range(200):
        nested = {"n": nested}
    assert Message.decode(Message("m", "k", "T", nested).encode()).body == nested
    with pytest.raises(TypeError, match="datetime"):
        Message("m", "k", "T", {"when": __import__("datetime").datetime.now()})
    huge = Message("m", "k-" + uuid.uuid4().hex, "Grow", {"blob": "x" * 2_000_000})

    @handler("Keeper")
    def keeper(state: dict[str, Any], message: Message, ctx: Any) -> None:
        state["last"] = message.body["blob"]

    outcome = Processor(keeper, table, InMemoryPublisher()).process(huge)
    assert outcome.status == "abandoned"
    assert isinstance(outcome.error, StateTooLargeError)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(size=st.sampled_from([0, 1, 65_535, 65_536, 65_537, 999_000, 999_950, 1_000_100, 1_048_576]))
def test_states_around_every_limit_are_stored_exactly_or_refused(
    table: TableClient, size: int
) -> None:
    @handler("Sized")
    def sized(state: dict[str, Any], message: Message, ctx: Any) -> None:
        state["blob"] = b"\xab" * message.body

    processor: Processor[dict[str, Any]] = Processor(sized, table, InMemoryPublisher())
    key = "s-" + uuid.uuid4().hex
    outcome = processor.process(Message("m", key, "Set", size))
    if outcome.status == "completed":
        assert processor.load_state(key, "x").state == {"blob": b"\xab" * size}
    else:
        assert isinstance(outcome.error, StateTooLargeError)
        assert processor.load_state(key, "x").version == 0
        assert size > 999_000


def test_invalid_json_bodies_are_reported_by_the_pipeline_parser() -> None:
    from spark_driver._tasks._rows import parse_row as _parse

    row = {"message_id": "m", "key": "k", "type": "FireAt", "body": "{not json"}
    message, reason = _parse(row, shooting_range.accepts)
    assert message is None
    assert reason is not None
    assert reason.startswith("unparseable body")
    ok, none = _parse({**row, "body": json.dumps({"position": 3})}, shooting_range.accepts)
    assert none is None
    assert ok == Message("m", "k", "FireAt", {"position": 3})


@pytest.mark.parametrize(
    ("type_", "refused_at"),
    [
        ("T" * 32768, None),  # 65,536 bytes in UTF-16: the limit itself
        ("T" * 32769, 65538),
        ("\U0001f600" * 16384, None),  # four bytes a character: 65,536 again
        ("\U0001f600" * 16385, 65540),
    ],
    ids=["ascii-limit", "ascii-over", "astral-limit", "astral-over"],
)
def test_a_type_one_property_cannot_hold_is_dead_lettered_at_the_exact_limit(
    type_: str, refused_at: int | None
) -> None:
    from spark_driver._tasks._rows import parse_row as _parse

    row = {"message_id": "m", "key": "k", "type": type_, "body": None}
    message, reason = _parse(row, lambda _: True)
    if refused_at is None:
        assert (message, reason) == (Message("m", "k", type_), None)
    else:
        assert message is None
        assert reason == (
            f"type cannot be stored: property 'MessageType' is a string of {refused_at} bytes "
            "in UTF-16; the limit is 65536"
        )
