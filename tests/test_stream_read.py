"""Reading: arguments, missing and empty streams, slices and paging."""

from __future__ import annotations

import uuid
from typing import Any, cast

import pytest
from azure.data.tables import TableClient

from streamstone_py import (
    EventData,
    Partition,
    RecordedEvent,
    Stream,
    StreamNotFoundError,
    _reads,
)
from streamstone_py._transport._protocol import Parallel
from tests.helpers import S, perform, raw, write_events


@pytest.mark.parametrize(("start", "size"), [(0, 10), (-5, 10), (1, 0), (1, -1)])
def test_bad_arguments_are_value_errors(partition: Partition, start: int, size: int) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        S.read(partition, start_version=start, slice_size=size)


def test_missing_stream_is_not_found(partition: Partition) -> None:
    with pytest.raises(StreamNotFoundError):
        S.read(partition)


def test_empty_stream(partition: Partition) -> None:
    provisioned = S.provision(partition)

    result = S.read(partition)

    assert result.stream == provisioned
    assert result.events == ()
    assert not result.has_events
    assert result.is_end_of_stream


def test_start_past_the_end(partition: Partition) -> None:
    stream = write_events(partition, 3)

    result = S.read(partition, start_version=10)

    assert result.stream == stream
    assert not result.has_events
    assert result.is_end_of_stream


def test_all_events_in_one_slice_in_version_order_with_ids(partition: Partition) -> None:
    stream = write_events(partition, 5)

    result = S.read(partition)

    assert result.stream == stream
    assert result.is_end_of_stream
    assert result.events == tuple(RecordedEvent(i, f"e{i}", {"N": i}) for i in range(1, 6))


def test_paging_with_slice_size_one_to_the_end(partition: Partition) -> None:
    write_events(partition, 4)
    seen: list[RecordedEvent] = []
    start = 1
    slices = 0
    while True:
        page = S.read(partition, start_version=start, slice_size=1)
        slices += 1
        assert len(page.events) == 1
        seen += page.events
        if page.is_end_of_stream:
            break
        start = page.events[-1].version + 1
    assert slices == 4
    assert [(e.version, e.id) for e in seen] == [(1, "e1"), (2, "e2"), (3, "e3"), (4, "e4")]


def test_slices_bigger_than_the_service_page(partition: Partition) -> None:
    # 1,200 events: the service answers 1,000 rows per page; one slice follows the pages.
    S.write(Stream(partition), *[EventData(properties={"N": i}) for i in range(1, 1201)])

    whole = S.read(partition, slice_size=1500)
    middle = S.read(partition, start_version=990, slice_size=20)

    assert [e.version for e in whole.events] == list(range(1, 1201))
    assert whole.is_end_of_stream
    assert [e.properties["N"] for e in middle.events] == list(range(990, 1010))
    assert not middle.is_end_of_stream


def _read_with_a_write_between(
    partition: Partition, query_first: bool, start_version: int, slice_size: int
) -> Any:
    """Drive a read by hand: its header read and events query run in the given order,
    with another writer's append between them."""
    steps = _reads.read(partition, start_version, slice_size, Stream)
    request = next(steps)
    assert isinstance(request, Parallel)
    get, query = request.requests
    writer = Stream.open(partition)

    def rival() -> None:
        Stream.write(writer, EventData(id="late", properties={"N": 99}))

    # The sync executor drives the steps, so the partition holds a sync client.
    table = cast(TableClient, partition.table)
    if query_first:
        rows = perform(table, query)
        rival()
        header = perform(table, get)
    else:
        header = perform(table, get)
        rival()
        rows = perform(table, query)
    result: Any = [header, rows]
    while True:
        try:
            follow_up = steps.send(result)
        except StopIteration as done:
            return done.value
        result = perform(table, follow_up)


def test_events_committed_between_query_and_header_are_fetched(table: Any) -> None:
    partition = Partition(table, "race-" + uuid.uuid4().hex)
    write_events(partition, 3)

    page = _read_with_a_write_between(partition, query_first=True, start_version=2, slice_size=10)

    assert page.stream.version == 4
    assert [(e.version, e.id) for e in page.events] == [(2, "e2"), (3, "e3"), (4, "late")]


def test_events_past_the_header_read_are_left_out(table: Any) -> None:
    partition = Partition(table, "race-" + uuid.uuid4().hex)
    write_events(partition, 3)

    page = _read_with_a_write_between(partition, query_first=False, start_version=2, slice_size=10)

    assert page.stream.version == 3
    assert [e.version for e in page.events] == [2, 3]
    assert page.is_end_of_stream


def _execute_with(partition: Partition, request: Any) -> Any:
    """One storage request through the partition's own client, sync or async."""
    if isinstance(request, Parallel):
        return [_execute_with(partition, r) for r in request.requests]
    return perform(partition.table, request)


def _finish(partition: Partition, steps: Any, result: Any) -> Any:
    while True:
        try:
            follow_up = steps.send(result)
        except StopIteration as done:
            return done.value
        result = _execute_with(partition, follow_up)


def test_point_reads_with_a_write_between_them_return_no_gap(partition: Partition) -> None:
    stream = write_events(partition, 4)
    steps = _reads.read(partition, 5, 2, Stream)
    request = next(steps)
    assert isinstance(request, Parallel)
    header_get, get5, get6 = request.requests
    # Version 5 is read before a rival appends 5 and 6; version 6 and the header after.
    row5 = _execute_with(partition, get5)
    Stream.write(
        Stream._stored(
            Partition(raw(partition), partition.partition_key),
            str(stream.etag),
            stream.version,
            stream.properties,
        ),
        *[EventData(id=f"e{v}", properties={"N": v}) for v in (5, 6)],
    )
    row6 = _execute_with(partition, get6)
    header = _execute_with(partition, header_get)
    assert row5 is None

    page = _finish(partition, steps, [header, row5, row6])

    assert page.stream.version == 6
    assert [(e.version, e.id) for e in page.events] == [(5, "e5"), (6, "e6")]
    assert page.is_end_of_stream


@pytest.mark.parametrize("slice_size", [3, 10])
def test_a_truncation_between_header_and_events_gives_a_consistent_slice(
    partition: Partition, slice_size: int
) -> None:
    stream = write_events(partition, 6)
    steps = _reads.read(partition, 2, slice_size, Stream)
    request = next(steps)
    assert isinstance(request, Parallel)
    header = _execute_with(partition, request.requests[0])
    S.truncate(stream, 4)  # the header now says "from 4", and versions 1-3 are gone
    events = [_execute_with(partition, r) for r in request.requests[1:]]

    page = _finish(partition, steps, [header, *events])

    assert (page.stream.version, page.stream.first_version) == (6, 4)
    assert page.truncated
    expected = [4] if slice_size == 3 else [4, 5, 6]
    assert [(e.version, e.id) for e in page.events] == [(v, f"e{v}") for v in expected]
