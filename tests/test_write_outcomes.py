"""What a write returns or raises, exactly: the conflicts of a transaction
and of one whose answer was lost, errors the engine does not map, and what a
split write that stopped part-way stored.

The sync and the async SDK client inject the faults in their transport
(``faulty``); a transaction travels as a POST to ``$batch``.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from azure.core.exceptions import ServiceRequestError
from azure.data.tables import TableClient, TableServiceClient, TableTransactionError
from azure.data.tables.aio import TableClient as AsyncTableClient

from streamstone_py import (
    ConcurrencyConflictError,
    EventData,
    Include,
    PartialWriteError,
    Partition,
    Stream,
    StreamstoneError,
    WireTableClient,
    WriteResult,
)
from streamstone_py._transport._faults import error_code
from streamstone_py.aio import AsyncWireTableClient
from tests.faults import BATCH, FAST, AsyncFaultyTransport, FaultPlan, FaultyTransport
from tests.helpers import S, rows, wait
from tests.test_faults import event_rows, events

UNKNOWN = "the stream changed while the outcome of a write was unknown"
#: 60 events with ids are 120 rows: a first transaction of 49 events, then 11.
IDS = [f"m{i}" for i in range(60)]
FIRST = IDS[:49]


def test_the_conflicts_of_a_transaction_say_what_they_met(partition: Partition) -> None:
    held = S.write(Stream(partition), *events("a")).stream
    with pytest.raises(ConcurrencyConflictError) as exists:
        S.write(Stream(partition), *events("b"))  # a new stream, where one is
    assert (exists.value.reason, exists.value.current) == ("the stream already exists", held)

    S.delete(held)
    with pytest.raises(ConcurrencyConflictError) as gone:
        S.write(held, *events("b"))  # the header it would replace is gone
    assert (gone.value.reason, gone.value.current) == ("the stream header has changed", None)
    assert rows(partition) == {}


def test_an_include_deleted_after_the_lost_commit_comes_back_without_etag(faulty: Any) -> None:
    partition, plan, clean = faulty

    def rival_deletes_the_included_row() -> None:
        clean.table.delete_entity(clean.partition_key, "proj")

    plan.add("after", *BATCH, meanwhile=rival_deletes_the_included_row)
    event = EventData(id="a", includes=[Include.insert({"RowKey": "proj", "N": 1})])

    result = S.write(Stream(partition), event)

    assert [(i.operation, i.etag) for i in result.includes] == [("insert", None)]
    assert result.stream == Stream.open(clean)
    assert sorted(rows(clean)) == ["SS-HEAD", "SS-SE-0000000001", "SS-UID-a"]


def test_lost_write_whose_stream_was_deleted_meanwhile_is_a_conflict(faulty: Any) -> None:
    partition, plan, clean = faulty
    stream = S.write(Stream(partition), *events("a")).stream

    def rival_deletes_the_stream() -> None:
        Stream.delete(Stream.open(clean))

    plan.add("lost", *BATCH, meanwhile=rival_deletes_the_stream)
    with pytest.raises(ConcurrencyConflictError) as caught:
        S.write(stream, *events("b"))

    assert type(caught.value) is ConcurrencyConflictError
    assert caught.value.reason == UNKNOWN
    assert caught.value.current is None
    assert rows(clean) == {}


@pytest.mark.parametrize(
    "kind", [TableClient, AsyncTableClient, WireTableClient, AsyncWireTableClient]
)
def test_a_transaction_error_the_engine_does_not_map_reaches_the_caller_unchanged(
    connection_string: str, kind: Any
) -> None:
    client = kind.from_connection_string(connection_string, "missing" + uuid.uuid4().hex[:8])
    try:
        with pytest.raises(TableTransactionError) as caught:
            S.write(Stream(Partition(client, "k")), *events("a"))
    finally:
        closed = client.close()
        if closed is not None:
            wait(closed)

    assert not isinstance(caught.value, StreamstoneError)
    assert (error_code(caught.value), caught.value.index) == ("TableNotFound", 0)


def first_transaction_of(error: StreamstoneError) -> Stream:
    """What ``error`` says the split write stored: its first transaction, exactly
    (the events, no include); the header it left."""
    committed: WriteResult[Stream] | None = getattr(error, "committed", None)
    assert committed is not None
    assert [(e.version, e.id) for e in committed.events] == list(enumerate(FIRST, start=1))
    assert committed.includes == ()
    assert committed.stream.version == 49
    return committed.stream


def test_a_split_write_whose_later_transaction_is_refused_on_every_try(faulty: Any) -> None:
    partition, plan, clean = faulty
    plan.add("pass", *BATCH).add("before", *BATCH, times=FAST.attempts)

    with pytest.raises(PartialWriteError) as caught:
        S.write(Stream(partition), *events(*IDS))

    assert plan.faults == []
    assert type(caught.value.__cause__) is ServiceRequestError
    assert first_transaction_of(caught.value) == Stream.open(clean)
    assert str(caught.value).startswith(
        "A write split over several transactions stopped after 49 of its events were "
        "stored, up to version 49: ServiceRequestError: injected fault: connection failed"
    )
    assert [i for _, i in event_rows(clean)] == FIRST
    assert rows(clean)["SS-HEAD"] == {"Version": 49}


def test_a_split_write_whose_later_transaction_could_not_be_settled(faulty: Any) -> None:
    # The second transaction is applied and its answer lost; every read that
    # would find out fails: it is stored, and the error says it may be.
    partition, plan, clean = faulty
    plan.add("pass", *BATCH).add("after", *BATCH).add("before", "GET", times=FAST.attempts)

    with pytest.raises(PartialWriteError) as caught:
        S.write(Stream(partition), *events(*IDS))

    assert plan.faults == []
    assert type(caught.value.__cause__) is ServiceRequestError
    assert first_transaction_of(caught.value).etag != Stream.open(clean).etag
    assert [i for _, i in event_rows(clean)] == IDS
    assert rows(clean)["SS-HEAD"] == {"Version": 60}


def test_a_split_write_whose_later_transaction_met_a_rival_says_what_it_stored(
    faulty: Any,
) -> None:
    partition, plan, clean = faulty

    def rival() -> None:
        Stream.write(Stream.open(clean), *events("rival"))

    plan.add("pass", *BATCH).add("lost", *BATCH, meanwhile=rival)
    with pytest.raises(ConcurrencyConflictError) as caught:
        S.write(Stream(partition), *events(*IDS))

    assert caught.value.reason == UNKNOWN
    first_transaction_of(caught.value)
    assert caught.value.current == Stream.open(clean)
    assert [i for _, i in event_rows(clean)] == [*FIRST, "rival"]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_split_write_whose_table_went_away_says_what_it_stored(
    connection_string: str, service: TableServiceClient, asynchronous: bool
) -> None:
    name = "gone" + uuid.uuid4().hex[:8]
    service.create_table(name)
    plan = FaultPlan()

    def the_table_is_deleted() -> None:
        service.delete_table(name)

    # The second transaction's connection fails before sending (retried at
    # once), and meanwhile its table is deleted: the retry finds none.
    plan.add("pass", *BATCH).add("before", *BATCH, meanwhile=the_table_is_deleted)
    client: Any
    if asynchronous:
        transport: Any = AsyncFaultyTransport(plan)
        client = AsyncTableClient.from_connection_string(
            connection_string, name, transport=transport
        )
    else:
        client = TableClient.from_connection_string(
            connection_string, name, transport=FaultyTransport(plan)
        )
    partition = Partition(client, "k", retry=FAST)
    try:
        with pytest.raises(PartialWriteError) as caught:
            S.write(Stream(partition), *events(*IDS))
    finally:
        closed = client.close()
        if closed is not None:
            wait(closed)

    cause = caught.value.__cause__
    assert isinstance(cause, TableTransactionError)
    assert error_code(cause) == "TableNotFound"
    first_transaction_of(caught.value)
