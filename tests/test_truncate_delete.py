"""Truncation and deletion: the header first, then a resumable sweep."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from azure.data.tables import TableClient

from streamstone_py import (
    ConcurrencyConflictError,
    DuplicateEventError,
    EventData,
    Include,
    Partition,
    Stream,
    StreamBeingDeletedError,
    StreamNotFoundError,
    _maintenance,
)
from streamstone_py._transport._protocol import Done, advance
from tests.helpers import S, perform, raw, rows, write_events


def crash_after(table: TableClient, steps: Any, requests: int) -> None:
    """Run only the first ``requests`` storage calls of a verb, then abandon it (a crash)."""
    result: object = None
    for _ in range(requests):
        try:
            request = advance(steps, result, None)
        except Done:
            pytest.fail("the verb finished before the crash point")
        result = perform(table, request)
    steps.close()


def test_truncate_removes_old_events_and_their_ids(partition: Partition) -> None:
    stream = write_events(partition, 10)

    truncated = S.truncate(stream, 6, batch_size=3)

    assert truncated.first_version == 6
    assert truncated.version == 10
    stored = rows(partition)
    assert stored["SS-HEAD"] == {"Version": 10, "SS_First": 6}
    assert sorted(k for k in stored if k.startswith("SS-SE-")) == [
        f"SS-SE-{v:010d}" for v in range(6, 11)
    ]
    assert sorted(k for k in stored if k.startswith("SS-UID-")) == sorted(
        f"SS-UID-e{v}" for v in range(6, 11)
    )
    assert S.open(partition) == truncated


def test_reading_a_truncated_range_says_so(partition: Partition) -> None:
    S.truncate(write_events(partition, 10), 6)

    old = S.read(partition, start_version=1, slice_size=3)
    whole = S.read(partition)
    fresh = S.read(partition, start_version=7)

    assert old.truncated
    assert old.first_available_version == 6
    assert old.events == ()
    assert not old.is_end_of_stream
    assert whole.truncated
    assert [e.version for e in whole.events] == [6, 7, 8, 9, 10]
    assert not fresh.truncated
    assert [e.id for e in fresh.events] == ["e7", "e8", "e9", "e10"]


def test_ids_below_the_cut_leave_the_duplicate_window(partition: Partition) -> None:
    stream = S.truncate(write_events(partition, 4), 3)

    with pytest.raises(DuplicateEventError):
        S.write(stream, EventData(id="e3"))
    again = S.write(stream, EventData(id="e1"))  # its id row is gone: it is new again

    assert again.stream.version == 5
    assert again.stream.first_version == 3
    assert rows(partition)["SS-HEAD"] == {"Version": 5, "SS_First": 3}


def test_truncate_with_a_stale_header_re_reads_and_keeps_new_events(partition: Partition) -> None:
    stale = write_events(partition, 4)
    newer = S.write(stale, EventData(id="e5")).stream

    truncated = S.truncate(stale, 3)

    assert (truncated.version, truncated.first_version) == (5, 3)
    assert truncated.etag != newer.etag
    assert [e.version for e in S.read(partition).events] == [3, 4, 5]
    with pytest.raises(ConcurrencyConflictError):
        S.write(newer, EventData(id="e6"))  # the truncation changed the header


def test_set_properties_and_writes_keep_the_cut(partition: Partition) -> None:
    stream = S.truncate(write_events(partition, 3), 2)
    stream = S.set_properties(stream, {"Owner": "x"})
    stream = S.write(stream, EventData(id="e4")).stream
    assert rows(partition)["SS-HEAD"] == {"Version": 4, "SS_First": 2, "Owner": "x"}
    assert S.open(partition).first_version == 2


def test_truncate_arguments(partition: Partition) -> None:
    stream = write_events(partition, 3)
    for bad in (0, 5):
        with pytest.raises(ValueError, match="before_version must be between 1 and 4"):
            S.truncate(stream, bad)
    with pytest.raises(ValueError, match="batch_size"):
        S.truncate(stream, 2, batch_size=101)
    with pytest.raises(ValueError, match="transient"):
        S.truncate(Stream(partition), 1)
    assert S.truncate(stream, 1) == stream  # nothing below version 1: no change
    everything = S.truncate(stream, 4)
    assert [k for k in rows(partition) if k != "SS-HEAD"] == []
    assert S.read(partition).events == ()
    assert everything.first_version == 4


def test_interrupted_truncation_is_finished_by_calling_again(client: TableClient) -> None:
    partition = Partition(client, "trunc-crash-" + uuid.uuid4().hex[:8])
    stream = write_events(partition, 12)
    # Header marked, then one query and one delete batch, then the process dies.
    crash_after(client, _maintenance.truncate(stream, 11, 4), requests=3)
    assert S.open(partition).first_version == 11
    assert [e.version for e in S.read(partition).events] == [11, 12]  # readers see the cut at once
    assert len(rows(partition)) > 1 + 4

    S.truncate(S.open(partition), 11)

    assert sorted(rows(partition)) == [
        "SS-HEAD",
        "SS-SE-0000000011",
        "SS-SE-0000000012",
        "SS-UID-e11",
        "SS-UID-e12",
    ]


def test_delete_removes_the_stream_but_not_its_includes(partition: Partition) -> None:
    events = [EventData(id=f"e{i}") for i in range(60)]
    events.append(EventData(id="last", includes=[Include.insert({"RowKey": "projection", "N": 1})]))
    stream = S.write(Stream(partition), *events).stream

    S.delete(stream, batch_size=7)

    assert rows(partition) == {"projection": {"N": 1}}
    assert S.exists(partition) is False
    with pytest.raises(StreamNotFoundError):
        S.read(partition)
    assert S.provision(partition).version == 0  # the key can hold a new stream


def test_delete_is_conditional_on_the_header(partition: Partition) -> None:
    stale = write_events(partition, 2)
    S.write(stale, EventData(id="e3"))
    before = rows(partition)

    with pytest.raises(ConcurrencyConflictError):
        S.delete(stale)

    assert rows(partition) == before


def test_interrupted_delete_hides_the_stream_and_is_finished_later(client: TableClient) -> None:
    partition = Partition(client, "delete-crash-" + uuid.uuid4().hex[:8])
    stale = write_events(partition, 30)
    # The tombstone, one query and one delete batch, then the process dies.
    crash_after(client, _maintenance.delete(stale, 10, Stream), requests=3)

    assert S.try_open(partition) is None
    with pytest.raises(StreamNotFoundError):
        S.read(partition)
    with pytest.raises(ConcurrencyConflictError):
        S.write(stale, EventData(id="late"))
    with pytest.raises(ConcurrencyConflictError):
        S.provision(partition)
    assert "SS-HEAD" in rows(partition)

    S.delete(stale)  # any header of the stream finishes the delete

    assert rows(partition) == {}


def test_deleting_one_virtual_stream_leaves_its_neighbours(client: TableClient) -> None:
    physical = "shared-" + uuid.uuid4().hex
    a = Partition(client, physical, "a")
    b = Partition(client, physical, "b")
    stream_a = write_events(a, 5)
    write_events(b, 5)
    before_b = {k: v for k, v in rows(b).items() if k.startswith("b|")}

    S.truncate(stream_a, 4)
    S.delete(S.open(a))

    assert {k: v for k, v in rows(b).items() if k.startswith("b|")} == before_b
    assert not any(k.startswith("a|") for k in rows(a))
    assert [e.id for e in S.read(b).events] == ["e1", "e2", "e3", "e4", "e5"]
    assert raw(a).table_name == raw(b).table_name


def test_interrupted_delete_is_finished_from_the_partition_alone(partition: Partition) -> None:
    stale = write_events(partition, 30)
    # The tombstone, one query and one delete batch (5 events, 5 ids), then the process dies.
    crash_after(raw(partition), _maintenance.delete(stale, 10, Stream), requests=3)
    leftover = rows(partition)
    assert leftover["SS-HEAD"] == {"Version": 30, "SS_Deleted": True}
    assert sorted(k for k in leftover if k.startswith("SS-SE-")) == [
        f"SS-SE-{v:010d}" for v in range(6, 31)
    ]
    assert len(leftover) == 51

    # A fresh process knows only the partition. Readers see no stream...
    assert S.try_open(partition) is None
    assert S.exists(partition) is False
    for read in (S.open, S.read):
        with pytest.raises(
            StreamNotFoundError, match=r"being deleted.*Stream\.delete\(partition\)"
        ):
            read(partition)
    # ...and every writer is told what to do.
    attempts: list[Callable[[], object]] = [
        lambda: S.provision(partition),
        lambda: S.write(partition, EventData(id="new"), expected_version=0),
        lambda: S.write(partition, EventData(id="new"), expected_version=30),
        lambda: S.write(Stream(partition), EventData(id="new")),
        lambda: S.write(stale, EventData(id="late")),
        lambda: S.set_properties(stale, {"Owner": "x"}),
        lambda: S.truncate(stale, 20),
    ]
    for attempt in attempts:
        with pytest.raises(
            StreamBeingDeletedError,
            match=r"being deleted.*finish it with Stream\.delete\(partition\)",
        ):
            attempt()
    with pytest.raises(ValueError, match=r"transient.*Stream\.delete\(partition\)"):
        S.delete(Stream(partition))
    assert rows(partition) == leftover

    S.delete(partition, batch_size=10)

    assert rows(partition) == {}
    with pytest.raises(StreamNotFoundError):
        S.delete(partition)
    assert S.provision(partition).version == 0


def test_delete_by_partition_deletes_the_stream_as_it_is(partition: Partition) -> None:
    events = [EventData(id=f"e{v}", includes=[Include.insert({"RowKey": f"p{v}"})]) for v in (1, 2)]
    S.write(Stream(partition), *events)

    S.delete(partition, batch_size=2)

    assert rows(partition) == {"p1": {}, "p2": {}}
    with pytest.raises(StreamNotFoundError, match="Stream not found"):
        S.open(partition)


def test_truncate_with_a_header_of_a_deleted_stream_never_sweeps_the_new_one(
    partition: Partition,
) -> None:
    old = S.truncate(write_events(partition, 5), 4)  # a header that says "from 4"
    S.delete(old)
    new = write_events(partition, 5)
    before = rows(partition)

    # Nothing of the new stream is below the old cut yet: mark its header, then sweep.
    truncated = S.truncate(old, 3)

    assert (truncated.version, truncated.first_version) == (5, 3)
    assert truncated.etag != new.etag
    swept = {"SS-SE-0000000001", "SS-SE-0000000002", "SS-UID-e1", "SS-UID-e2"}
    assert rows(partition) == {
        **{k: v for k, v in before.items() if k not in swept},
        "SS-HEAD": {"Version": 5, "SS_First": 3},
    }
    assert [e.version for e in S.read(partition).events] == [3, 4, 5]


def test_truncate_with_a_header_longer_than_the_recreated_stream_conflicts(
    partition: Partition,
) -> None:
    old = write_events(partition, 8)
    S.delete(old)
    write_events(partition, 2)
    before = rows(partition)

    with pytest.raises(ConcurrencyConflictError, match="at version 2 now, below the cut 6"):
        S.truncate(old, 6)

    assert rows(partition) == before
