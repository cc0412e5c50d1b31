"""Stream.scan / scan_keys and handlers.scan_states: every stream of one name across
partitions, and nothing of another name, another handler or a stream being deleted."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from azure.data.tables import TableClient, TableServiceClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from handlers import InMemoryPublisher, KeyState, Message, Processor, scan_keys, scan_states
from handlers.examples import LeaderBoard, ShootingRange, leader_board, shooting_range
from spark_driver._states import _ranges
from streamstone_py import EventData, Partition, ScannedStream, Stream, key_order


@pytest.fixture
def own_table(service: TableServiceClient) -> Iterator[TableClient]:
    """A table of this test alone: a scan sees the whole table."""
    name = "scan" + uuid.uuid4().hex[:12]
    client = service.create_table_if_not_exists(name)
    yield client
    service.delete_table(name)


def test_scan_finds_every_stream_of_one_name_and_nothing_else(own_table: TableClient) -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    # Plain streams in a and b; the virtual stream "orders" in a, c and d; "other" in b.
    Stream.write(Stream(Partition(own_table, "a")), EventData(id="p-1"))
    Stream.write(Stream(Partition(own_table, "b"), {"Color": "red"}), EventData(id="p-2"))
    for key in ("a", "c", "d"):
        Stream.write(Stream(Partition(own_table, key, "orders")), EventData(), EventData())
    Stream.write(Stream(Partition(own_table, "b", "other")), EventData())
    # d's delete was interrupted after it marked the header: readers see no stream.
    own_table.update_entity({"PartitionKey": "d", "RowKey": "orders|SS-HEAD", "SS_Deleted": True})

    orders = list(Stream.scan(own_table, "orders"))
    plain = list(Stream.scan(own_table))

    assert [(s.stream.partition.key, s.stream.version) for s in orders] == [
        ("a|orders", 2),
        ("c|orders", 2),
    ]
    assert [
        (s.stream.partition.key, s.stream.version, dict(s.stream.properties)) for s in plain
    ] == [
        ("a", 1, {}),
        ("b", 1, {"Color": "red"}),
    ]
    assert all(isinstance(s, ScannedStream) for s in orders)
    assert all(before <= s.updated <= datetime.now(UTC) for s in orders + plain)
    assert {type(s.updated) for s in orders + plain} == {datetime}
    # A scanned header is the one open reads: it writes on, conditional on its ETag.
    assert orders[1].stream == Stream.open(Partition(own_table, "c", "orders"))
    Stream.write(orders[1].stream, EventData(id="next"))
    assert list(Stream.scan_keys(own_table, "orders")) == ["a", "c"]
    assert list(Stream.scan_keys(own_table)) == ["a", "b"]
    assert list(Stream.scan_keys(own_table, "other")) == ["b"]


def test_scan_ranges_are_half_open_and_pages_are_followed(own_table: TableClient) -> None:
    keys = [f"k-{n:03d}" for n in range(25)]
    for key in keys:
        Stream.write(Stream(Partition(own_table, key, "s")), EventData())

    assert list(Stream.scan_keys(own_table, "s", page_size=7)) == keys
    assert list(Stream.scan_keys(own_table, "s", start_key="k-010", end_key="k-013")) == [
        "k-010",
        "k-011",
        "k-012",
    ]
    assert list(Stream.scan_keys(own_table, "s", end_key="k-002")) == ["k-000", "k-001"]
    tail = [
        s.stream.partition.partition_key for s in Stream.scan(own_table, "s", start_key="k-0225")
    ]
    assert tail == ["k-023", "k-024"]


def test_scan_refuses_bad_arguments_with_the_bad_value(own_table: TableClient) -> None:
    with pytest.raises(ValueError, match="page_size must be an int from 1 to 1000, got 0"):
        list(Stream.scan(own_table, "s", page_size=0))
    with pytest.raises(ValueError, match=r"contains the separator '\|'"):
        list(Stream.scan_keys(own_table, "a|b"))
    with pytest.raises(TypeError, match=r"start_key \(a str or None\) must be a str, got int: 3"):
        list(Stream.scan(own_table, "s", start_key=3))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"table must be an azure\.data\.tables\.TableClient"):
        list(Stream.scan("table", "s"))  # type: ignore[arg-type]


def test_scan_states_reads_one_handler_s_newest_states(own_table: TableClient) -> None:
    shots: Processor[ShootingRange] = Processor(shooting_range, own_table, InMemoryPublisher())
    board: Processor[LeaderBoard] = Processor(leader_board, own_table, InMemoryPublisher())
    for game in ("g-2", "g-1", "g-3"):
        shots.process_batch(
            game,
            [Message(f"{game}-r", game, "StartNewRound")]
            + [Message(f"{game}-{n}", game, "FireAt", {"position": n}) for n in range(2)],
        )
    # Another handler's stream in the same partition, and in a partition of its own.
    board.process(Message("h-1", "g-1", "Hit", {"player": "ann"}))
    board.process(Message("h-2", "g-9", "Missed", {"player": "bob"}))
    shots.retain("g-3", keep_last=1)

    found = list(scan_states(shooting_range, own_table))

    assert [KeyState(s.key, s.version, s.state) for s in found] == [
        shots.current_state(key) for key in ("g-1", "g-2", "g-3")
    ]
    assert all(s.updated is not None for s in found)
    assert list(scan_keys(shooting_range, own_table, start_key="g-2")) == ["g-2", "g-3"]
    assert [(s.key, s.state) for s in scan_states(leader_board, own_table)] == [
        ("g-1", LeaderBoard(hits=1, players={"ann": 1})),
        ("g-9", LeaderBoard(misses=1)),
    ]


# --- key ranges in the table's order ------------------------------------------------

#: Characters where code-point order and the table's UTF-16 order disagree:
#: beyond U+FFFF (a surrogate pair, D800-DFFF) against U+E000 to U+FFFF.
_ORDER_EDGES = ["\U0001f600", "\U00010000", "\U0010fffd", "\uff01", "\ue000", "\ufffd", "a"]
_any_char = st.characters(
    blacklist_categories=("Cs", "Cc"), blacklist_characters="/\\#?|", max_codepoint=0x10FFFF
)
#: Keys of the whole of Unicode, and keys of the edge characters alone, which
#: share prefixes often enough to land on both sides of a range bound.
_keys = st.lists(
    st.one_of(
        st.text(_any_char, min_size=1, max_size=6),
        st.text(st.sampled_from(_ORDER_EDGES), min_size=1, max_size=3),
    ),
    min_size=1,
    max_size=12,
    unique=True,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keys=_keys, parts=st.integers(1, 6))
@example(keys=["game-a", "game-b\U0001f600", "game-b\uff01", "game-c"], parts=4)
def test_key_ranges_cover_every_key_exactly_once_in_the_tables_order(
    service: TableServiceClient, keys: list[str], parts: int
) -> None:
    name = "order" + uuid.uuid4().hex[:12]
    table = service.create_table(name)
    try:
        for key in keys:
            Stream.write(Stream(Partition(table, key, "Tally")), EventData())
        listed = list(Stream.scan_keys(table, "Tally"))
        assert sorted(listed, key=key_order) == listed  # the table's own order
        assert sorted(listed) == sorted(keys)

        scanned = [
            key
            for start, end in _ranges(listed, parts)
            for key in Stream.scan_keys(table, "Tally", start_key=start, end_key=end)
        ]

        assert scanned == listed
    finally:
        service.delete_table(name)
