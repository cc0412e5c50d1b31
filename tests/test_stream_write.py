"""Writing: versions, exact rows, conflicts, duplicates, expected versions, chunking."""

from __future__ import annotations

import re

import pytest
from azure.core import MatchConditions
from azure.data.tables import UpdateMode

from streamstone_py import (
    ConcurrencyConflictError,
    DuplicateEventError,
    EventData,
    Partition,
    PropertyValue,
    RecordedEvent,
    Stream,
    StreamNotFoundError,
)
from tests.helpers import S, raw, rows, snapshot


def event(id: str, **properties: PropertyValue) -> EventData:
    return EventData(id=id, properties={"Type": "Tested", **properties})


def test_write_to_new_stream_creates_it_with_exact_rows(partition: Partition) -> None:
    result = S.write(Stream(partition, {"Owner": "me"}), event("e1", N=1), event("e2", N=2))

    assert result.stream.version == 2
    assert result.stream.etag
    assert dict(result.stream.properties) == {"Owner": "me"}
    assert result.events == (
        RecordedEvent(1, "e1", {"Type": "Tested", "N": 1}),
        RecordedEvent(2, "e2", {"Type": "Tested", "N": 2}),
    )
    assert rows(partition) == {
        "SS-HEAD": {"Version": 2, "Owner": "me"},
        "SS-SE-0000000001": {"Version": 1, "SS_Id": "e1", "Type": "Tested", "N": 1},
        "SS-SE-0000000002": {"Version": 2, "SS_Id": "e2", "Type": "Tested", "N": 2},
        "SS-UID-e1": {"Version": 1},
        "SS-UID-e2": {"Version": 2},
    }


def test_write_to_existing_stream_advances_version_and_etag(partition: Partition) -> None:
    provisioned = S.provision(partition)
    first = S.write(provisioned, event("e1"))
    second = S.write(first.stream, event("e2"), event("e3"))

    assert first.stream.version == 1
    assert second.stream.version == 3
    assert len({provisioned.etag, first.stream.etag, second.stream.etag}) == 3
    assert [e.version for e in second.events] == [2, 3]
    assert S.open(partition) == second.stream
    assert sorted(rows(partition)) == [
        "SS-HEAD",
        "SS-SE-0000000001",
        "SS-SE-0000000002",
        "SS-SE-0000000003",
        "SS-UID-e1",
        "SS-UID-e2",
        "SS-UID-e3",
    ]


def test_events_without_ids_store_no_id_rows(partition: Partition) -> None:
    result = S.write(Stream(partition), EventData(properties={"A": 1}), EventData())

    assert [(e.version, e.id) for e in result.events] == [(1, None), (2, None)]
    assert rows(partition) == {
        "SS-HEAD": {"Version": 2},
        "SS-SE-0000000001": {"Version": 1, "A": 1},
        "SS-SE-0000000002": {"Version": 2},
    }


def test_write_with_transient_header_over_existing_stream_conflicts(partition: Partition) -> None:
    S.provision(partition)
    before = snapshot(partition)

    with pytest.raises(ConcurrencyConflictError, match="already exists"):
        S.write(Stream(partition), event("e1"))

    assert snapshot(partition) == before


def _change_header(partition: Partition) -> None:
    header = raw(partition).get_entity(partition.partition_key, "SS-HEAD")
    raw(partition).update_entity(
        header,
        mode=UpdateMode.REPLACE,
        etag=header.metadata["etag"],
        match_condition=MatchConditions.IfNotModified,
    )


@pytest.mark.parametrize(
    ("header_changed", "event_exists", "id_exists"),
    [
        (True, False, False),
        (True, True, False),
        (True, False, True),
        (True, True, True),
        (False, True, False),
        (False, True, True),
    ],
)
def test_write_conflicts_leave_partition_unchanged(
    partition: Partition, header_changed: bool, event_exists: bool, id_exists: bool
) -> None:
    stream = S.write(Stream(partition), event("e1")).stream
    pk = partition.partition_key
    if header_changed:
        _change_header(partition)
    if event_exists:
        raw(partition).create_entity(
            {"PartitionKey": pk, "RowKey": "SS-SE-0000000002", "Version": 2}
        )
    if id_exists:
        raw(partition).create_entity({"PartitionKey": pk, "RowKey": "SS-UID-e2", "Version": 2})
    before = snapshot(partition)

    with pytest.raises(ConcurrencyConflictError) as caught:
        S.write(stream, event("e2"))

    assert caught.value.partition == partition
    assert snapshot(partition) == before
    assert caught.value.current == S.open(partition)  # the header read with the refusal


def test_a_conflict_hands_back_the_stored_header_to_write_on(partition: Partition) -> None:
    S.provision(partition)
    with pytest.raises(ConcurrencyConflictError, match="already exists") as created:
        S.write(Stream(partition), event("e1"))
    provisioned = created.value.current
    assert provisioned is not None
    assert provisioned.version == 0
    stale = S.write(provisioned, event("e1")).stream
    _change_header(partition)
    with pytest.raises(ConcurrencyConflictError, match="header has changed") as moved:
        S.write(stale, event("e2"))

    current = moved.value.current
    assert current == S.open(partition)
    assert current is not None
    assert current.etag != stale.etag
    # Written on it, with no other read: the retry a header cache makes.
    assert S.write(current, event("e2")).stream.version == 2
    assert rows(partition)["SS-HEAD"] == {"Version": 2}


def test_id_row_alone_reports_duplicate(partition: Partition) -> None:
    stream = S.write(Stream(partition), event("e1")).stream
    raw(partition).create_entity(
        {"PartitionKey": partition.partition_key, "RowKey": "SS-UID-e2", "Version": 9}
    )
    before = snapshot(partition)

    with pytest.raises(DuplicateEventError) as caught:
        S.write(stream, event("e2"))

    assert caught.value.id == "e2"
    assert snapshot(partition) == before


def test_duplicate_event_inside_a_write_names_it_and_writes_nothing(partition: Partition) -> None:
    stream = S.write(Stream(partition), event("e1"), event("e2")).stream
    before = snapshot(partition)

    with pytest.raises(DuplicateEventError) as caught:
        S.write(stream, event("e3"), event("e2"))

    assert caught.value.id == "e2"
    assert caught.value.partition == partition
    assert "'e2'" in str(caught.value)
    assert snapshot(partition) == before
    assert S.open(partition).version == 2


def test_same_id_twice_in_one_write_is_refused_before_sending(partition: Partition) -> None:
    with pytest.raises(ValueError, match="'x' appears twice"):
        S.write(Stream(partition), event("x"), event("x"))
    assert rows(partition) == {}


def test_expected_version_writes(partition: Partition) -> None:
    first = S.write(partition, event("e1"), event("e2"), expected_version=0)
    assert first.stream.version == 2

    second = S.write(partition, event("e3"), expected_version=2)
    assert second.stream.version == 3
    assert [e.version for e in second.events] == [3]

    before = snapshot(partition)
    with pytest.raises(ConcurrencyConflictError, match="already exists"):
        S.write(partition, event("e4"), expected_version=0)
    with pytest.raises(ConcurrencyConflictError, match="expected version 2, the stream is at 3"):
        S.write(partition, event("e4"), expected_version=2)
    assert snapshot(partition) == before


def test_expected_version_of_missing_stream_is_not_found(partition: Partition) -> None:
    with pytest.raises(StreamNotFoundError):
        S.write(partition, event("e1"), expected_version=3)
    assert rows(partition) == {}


@pytest.mark.parametrize("bad", [-1, True, 1.0, "1"])
def test_expected_version_must_be_a_non_negative_int(partition: Partition, bad: object) -> None:
    with pytest.raises((ValueError, TypeError), match="expected_version"):
        S.write(partition, event("e1"), expected_version=bad)  # type: ignore[arg-type]  # the point


def test_write_argument_errors(partition: Partition) -> None:
    stream = Stream(partition)
    with pytest.raises(ValueError, match="at least one event"):
        S.write(stream)
    needs = "a write to a Partition needs expected_version=N (0: a new stream)"
    with pytest.raises(TypeError, match=f"^{re.escape(needs)}$"):
        S.write(partition, event("e1"))
    header = "expected_version is for writes to a Partition, not to a header"
    with pytest.raises(TypeError, match=f"^{re.escape(header)}$"):
        S.write(stream, event("e1"), expected_version=0)
    neither = "write target must be a Stream or a Partition, got 'p-1'"
    for target, version in (("p-1", None), ("p-1", 0)):
        with pytest.raises(TypeError, match=f"^{re.escape(neither)}$"):
            S.write(target, event("e1"), expected_version=version)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="EventData"):
        S.write(stream, {"Type": "x"})  # type: ignore[arg-type]  # a dict, not an EventData
    assert rows(partition) == {}


def test_write_over_batch_limit_is_split_and_fully_stored(partition: Partition) -> None:
    # 150 events with ids need 300 rows: at least four transactions of <= 99 rows each.
    events = [event(f"e{i}", N=i) for i in range(1, 151)]

    result = S.write(Stream(partition), *events)

    assert result.stream.version == 150
    assert [e.version for e in result.events] == list(range(1, 151))
    assert S.open(partition) == result.stream
    stored = rows(partition)
    assert len(stored) == 1 + 150 + 150
    assert stored["SS-HEAD"] == {"Version": 150}
    for i in range(1, 151):
        assert stored[f"SS-SE-{i:010d}"] == {
            "Version": i,
            "SS_Id": f"e{i}",
            "Type": "Tested",
            "N": i,
        }
        assert stored[f"SS-UID-e{i}"] == {"Version": i}


def test_exactly_99_rows_fit_one_transaction_and_100_do_not(partition: Partition) -> None:
    # 99 id-less events + the header = 100 operations: one transaction.
    one = S.write(Stream(partition), *[EventData() for _ in range(99)])
    assert one.stream.version == 99
    assert one.stream.etag == S.open(partition).etag

    other = Partition(partition.table, partition.partition_key + "-b")
    two = S.write(Stream(other), *[EventData() for _ in range(100)])
    assert two.stream.version == 100
    assert len(rows(other)) == 101


def test_failure_in_a_later_chunk_reports_what_was_committed(partition: Partition) -> None:
    S.provision(partition)
    # Plant an id row that the second transaction of the write will collide with.
    raw(partition).create_entity(
        {"PartitionKey": partition.partition_key, "RowKey": "SS-UID-e80", "Version": 999}
    )
    stream = S.open(partition)
    events = [event(f"e{i}") for i in range(1, 81)]  # 160 rows: two transactions

    with pytest.raises(DuplicateEventError) as caught:
        S.write(stream, *events)

    committed = caught.value.committed
    assert committed is not None
    assert committed.stream.version == len(committed.events) == 49
    assert S.open(partition) == committed.stream
    assert caught.value.id == "e80"


@pytest.mark.parametrize(
    "name",
    ["PartitionKey", "RowKey", "Timestamp", "ETag", "odata.etag", "Version", "SS_Id", "ss_id"],
)
def test_reserved_event_property_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match=f"'{name}' is reserved"):
        EventData(id="e1", properties={name: 1})


def test_find_gives_the_version_of_an_event_id(partition: Partition) -> None:
    S.write(Stream(partition), event("a"), EventData(), event("c"))
    assert S.find(partition, "a") == 1
    assert S.find(partition, "c") == 3
    assert S.find(partition, "zzz") is None
    with pytest.raises(ValueError, match="event id row key"):
        S.find(partition, "bad/id")


def test_with_properties_stores_header_properties_with_the_events(partition: Partition) -> None:
    stream = S.write(Stream(partition, {"A": 1}), event("e1")).stream
    changed = stream.with_properties({"B": b"snapshot"})
    assert (changed.etag, changed.version) == (stream.etag, stream.version)
    assert dict(stream.properties) == {"A": 1}

    result = S.write(changed, event("e2"))

    assert dict(result.stream.properties) == {"B": b"snapshot"}
    assert rows(partition)["SS-HEAD"] == {"Version": 2, "B": b"snapshot"}
    with pytest.raises(ConcurrencyConflictError):
        S.write(stream.with_properties({"C": 1}), event("e3"))  # still conditional on the ETag
    with pytest.raises(ValueError, match="reserved"):
        stream.with_properties({"Version": 9})


def test_stream_properties_of_an_event_go_into_its_transactions_header(
    partition: Partition,
) -> None:
    # Each event carries the header's snapshot as of itself: N = its version.
    events = [
        EventData(id=f"e{i}", properties={"N": i}, stream_properties={"Upto": i})
        for i in range(1, 81)
    ]
    raw(partition).create_entity(  # the second transaction collides with this id row
        {"PartitionKey": partition.partition_key, "RowKey": "SS-UID-e80", "Version": 999}
    )

    with pytest.raises(DuplicateEventError) as caught:
        S.write(Stream(partition, {"Upto": 0}), *events)

    committed = caught.value.committed
    assert committed is not None
    assert committed.stream.version == 49
    # The header holds the snapshot of the last event it stored, not of the whole write.
    assert dict(committed.stream.properties) == {"Upto": 49}
    assert rows(partition)["SS-HEAD"] == {"Version": 49, "Upto": 49}
    assert S.open(partition) == committed.stream


def test_stream_properties_carry_forward_and_reach_the_result(partition: Partition) -> None:
    events = [
        EventData(id="a", stream_properties={"S": b"after-a"}),
        EventData(id="b"),  # keeps the snapshot of "a"
    ]
    result = S.write(Stream(partition, {"S": b"before"}), *events)
    assert dict(result.stream.properties) == {"S": b"after-a"}
    assert rows(partition)["SS-HEAD"] == {"Version": 2, "S": b"after-a"}

    later = S.write(result.stream, EventData(id="c"))  # no snapshot: the header's stay
    assert dict(later.stream.properties) == {"S": b"after-a"}
    with pytest.raises(ValueError, match="reserved"):
        EventData(id="d", stream_properties={"Version": 1})


def test_a_large_snapshot_counts_against_every_transaction(partition: Partition) -> None:
    # Events of ~720 KB and a ~720 KB header snapshot (~960 KB each on the wire, as
    # base64): 4 MiB holds the header and three such events, so four events split 3 + 1.
    blob = b"x" * 60_000
    snapshot_props = {f"S{i}": blob for i in range(12)}
    events = [
        EventData(
            id=f"e{i}",
            properties={f"P{j}": blob for j in range(12)},
            stream_properties=snapshot_props,
        )
        for i in range(1, 5)
    ]
    result = S.write(Stream(partition), *events)
    assert result.stream.version == 4
    assert rows(partition)["SS-HEAD"] == {"Version": 4, **snapshot_props}
