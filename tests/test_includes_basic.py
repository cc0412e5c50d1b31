"""Included entities travel in the event's transaction (the full matrix is issue 3's)."""

from __future__ import annotations

import pytest

from streamstone_py import (
    ConcurrencyConflictError,
    DuplicateEventError,
    EventData,
    Include,
    IncludedOperationConflictError,
    Partition,
    Stream,
)
from tests.helpers import S, raw, rows, snapshot


def test_include_is_written_with_the_event_and_gets_an_etag(partition: Partition) -> None:
    result = S.write(
        Stream(partition),
        EventData(id="e1", includes=[Include.insert({"RowKey": "proj", "Total": 5})]),
    )

    (included,) = result.includes
    assert included.operation == "insert"
    assert included.etag
    stored = raw(partition).get_entity(partition.partition_key, "proj")
    assert stored.metadata["etag"] == included.etag
    assert rows(partition)["proj"] == {"Total": 5}

    # The ETag comes from the entity as read, or is given explicitly.
    assert Include.replace(stored).etag == included.etag
    change = Include.replace({**stored, "Total": 9}, etag=included.etag)
    replaced = S.write(result.stream, EventData(id="e2", includes=[change]))
    assert rows(partition)["proj"] == {"Total": 9}
    assert replaced.includes[0].etag != included.etag

    stale = Include.replace({**stored, "Total": 1}, etag=included.etag)
    with pytest.raises(IncludedOperationConflictError):
        S.write(replaced.stream, EventData(id="e3", includes=[stale]))
    assert rows(partition)["proj"] == {"Total": 9}


def test_failing_include_names_the_entity_and_writes_nothing(partition: Partition) -> None:
    stream = S.write(
        Stream(partition), EventData(id="e1", includes=[Include.insert({"RowKey": "proj"})])
    ).stream
    before = snapshot(partition)

    with pytest.raises(IncludedOperationConflictError) as caught:
        S.write(stream, EventData(id="e2", includes=[Include.insert({"RowKey": "proj"})]))

    assert caught.value.entity["RowKey"] == "proj"
    assert "'proj'" in str(caught.value)
    assert snapshot(partition) == before


def test_duplicate_id_and_stale_header_win_over_a_failing_include(partition: Partition) -> None:
    stream = S.write(
        Stream(partition), EventData(id="e1", includes=[Include.insert({"RowKey": "proj"})])
    ).stream
    clash = [Include.insert({"RowKey": "proj"})]

    with pytest.raises(DuplicateEventError):
        S.write(stream, EventData(id="e1", includes=clash))
    S.write(stream, EventData(id="e2"))
    with pytest.raises(ConcurrencyConflictError):
        S.write(stream, EventData(id="e3", includes=clash))


def test_includes_may_not_address_stream_rows(partition: Partition) -> None:
    for row_key in ("SS-HEAD", "SS-SE-0000000001", "SS-UID-x", "other|SS-HEAD"):
        with pytest.raises(ValueError, match="reserved for stream rows"):
            Include.insert_or_replace({"RowKey": row_key})
    with pytest.raises(ValueError, match="needs an etag"):
        Include.replace({"RowKey": "proj"})
