"""Azure's size limits, checked on the client at their exact boundaries."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from azure.data.tables import TableClient

from azurite.proxy import Proxy
from streamstone_py import (
    EventData,
    Include,
    Partition,
    PropertyValue,
    Stream,
    join_binary,
    split_binary,
)
from streamstone_py._codec._payload import TRANSACTION_BYTES, operation_bytes
from streamstone_py._codec._values import MAX_ENTITY_BYTES, entity_size
from streamstone_py._plan import MAX_BATCH_BYTES, plan
from streamstone_py._rows import header_entity
from tests.faults import FaultPlan, FaultyTransport
from tests.helpers import S, rows


def test_a_snapshot_of_a_million_bytes_fits_one_event_row(partition: Partition) -> None:
    blob = bytes(range(256)) * 3906 + b"tail"  # 1,000,000 bytes
    event = EventData(id="snap", properties={"Type": "Snapshot", **split_binary("State", blob)})

    S.write(Stream(partition), event)

    (stored,) = S.read(partition).events
    assert join_binary("State", stored.properties) == blob
    row = rows(partition)["SS-SE-0000000001"]
    assert row["State_Parts"] == 16
    assert sorted(k for k in row if k.startswith("State_") and k != "State_Parts") == [
        f"State_{i:02d}" for i in range(16)
    ]


def test_split_binary_edges() -> None:
    assert split_binary("S", b"") == {"S_00": b"", "S_Parts": 1}
    assert join_binary("S", split_binary("S", b"abcdefg", part_size=3)) == b"abcdefg"
    parts = split_binary("S", b"abcdefg", part_size=3)
    del parts["S_01"]
    with pytest.raises(ValueError, match="lacks part 'S_01' of 3"):
        join_binary("S", parts)
    with pytest.raises(KeyError, match="S_Parts"):
        join_binary("S", {})
    with pytest.raises(ValueError, match="identifier"):
        split_binary("bad name", b"x")
    with pytest.raises(ValueError, match="part_size"):
        split_binary("S", b"x", part_size=65537)


def test_entity_at_exactly_one_mib_is_stored_and_one_byte_more_is_refused(
    partition: Partition,
) -> None:
    def event_with(padding: int) -> EventData:
        return EventData(id="e", properties={**split_binary("B", b"x" * padding)})

    # Size the padding so that the event row is exactly 1 MiB by Azure's formula.
    keys = {"PartitionKey": partition.partition_key, "RowKey": partition.event_row_key(1),
            "Version": 1, "SS_Id": "e"}  # fmt: skip
    padding = MAX_ENTITY_BYTES
    while (size := entity_size({**keys, **event_with(padding).properties})) != MAX_ENTITY_BYTES:
        padding -= size - MAX_ENTITY_BYTES
    exact = event_with(padding)

    with pytest.raises(
        ValueError, match=f"is {MAX_ENTITY_BYTES + 1} bytes; the limit of one entity"
    ):
        S.write(Stream(partition), event_with(padding + 1))
    assert rows(partition) == {}

    S.write(Stream(partition), exact)
    (stored,) = S.read(partition).events
    assert len(join_binary("B", stored.properties)) == padding


def test_properties_per_entity_boundary(partition: Partition) -> None:
    # With an id, the event row also holds Version and SS_Id: 250 user properties fit.
    fits = EventData(id="e1", properties={f"P{i}": i for i in range(250)})
    too_many = EventData(id="e2", properties={f"P{i}": i for i in range(251)})

    with pytest.raises(ValueError, match="253 properties; Azure Tables allows 252"):
        S.write(Stream(partition), too_many)
    result = S.write(Stream(partition), fits)

    assert len(result.events[0].properties) == 250
    assert len(rows(partition)["SS-SE-0000000001"]) == 252


@pytest.fixture
def counted(connection_string: str, table: TableClient) -> Iterator[tuple[Partition, FaultPlan]]:
    plan = FaultPlan()  # no faults: it only counts the requests
    client = TableClient.from_connection_string(
        connection_string, table.table_name, transport=FaultyTransport(plan)
    )
    yield Partition(client, "size-" + uuid.uuid4().hex), plan
    client.close()


def test_100_operations_are_one_transaction_and_101_are_two(counted: Any) -> None:
    partition, plan = counted
    other = Partition(partition.table, partition.partition_key + "-b")

    Stream.write(Stream(partition), *[EventData() for _ in range(99)])  # + header = 100
    assert plan.requests == 1
    Stream.write(Stream(other), *[EventData() for _ in range(100)])  # + header = 101
    assert plan.requests == 1 + 2
    assert Stream.open(other).version == 100


def test_a_write_over_4_mib_is_split_by_bytes(counted: Any) -> None:
    partition, plan = counted
    blob = b"\xff" * 900_000  # about 1.2 MB per event once base64-encoded
    events = [EventData(id=f"s{i}", properties=split_binary("State", blob)) for i in range(6)]

    result = Stream.write(Stream(partition), *events)

    # Six events (12 rows) would fit one transaction by count, not by bytes.
    assert plan.requests >= 2
    assert result.stream.version == 6
    assert all(join_binary("State", e.properties) == blob for e in Stream.read(partition).events)


def test_one_event_over_4_mib_with_its_includes_is_refused(partition: Partition) -> None:
    big = split_binary("B", b"y" * 900_000)
    includes = [Include.insert({"RowKey": f"i{n}", **big}) for n in range(3)]
    event = EventData(id="e", properties=big, includes=includes)

    with pytest.raises(ValueError, match="holds 99 besides the header and 4194304 bytes"):
        S.write(Stream(partition), EventData(id="small"), event)

    assert rows(partition) == {}


# --- transactions sized in the bytes they carry ---------------------------------------


def _cjk_event(n: int, first: int = 0x4E00) -> EventData:
    """250 Int64 properties whose names are 250 CJK characters each: about
    760 KB of request per event, though 129 KB by the entity-size formula."""
    names = [chr(first + i) * 250 for i in range(250)]
    return EventData(id=f"e{n}", properties=dict.fromkeys(names, 2**62 + n))


def _batches(proxy: Proxy) -> list[int]:
    return [len(r.body) for r, _ in proxy.seen if b"$batch" in r.head]


def test_a_write_of_wide_names_is_split_so_each_transaction_fits_4_mib(
    proxied_client: Any, proxy: Proxy
) -> None:
    # Azure answers a transaction over 4 MiB with 413; the proxy does as it does.
    proxy.max_body = MAX_BATCH_BYTES
    partition = Partition(proxied_client, "wide-" + uuid.uuid4().hex[:8])
    events = [_cjk_event(n) for n in range(1, 9)]

    result = S.write(Stream(partition), *events)

    assert result.stream.version == 8
    sizes = _batches(proxy)
    assert len(sizes) == 2, sizes
    assert max(sizes) <= MAX_BATCH_BYTES, sizes
    assert sum(sizes) > MAX_BATCH_BYTES  # one transaction would not have fitted
    stored = rows(partition)  # a plain azure-data-tables client's view
    for event in events:
        version = int(event.id[1:])  # type: ignore[index]
        assert stored[partition.event_row_key(version)] == {
            **event.properties, "Version": version, "SS_Id": event.id,
        }  # fmt: skip
    read = S.read(partition).events
    assert [dict(e.properties) for e in read] == [dict(e.properties) for e in events]


def test_an_event_whose_request_cannot_fit_4_mib_is_refused_before_sending(
    proxied_client: Any, proxy: Proxy
) -> None:
    partition = Partition(proxied_client, "wide-" + uuid.uuid4().hex[:8])
    wide = _cjk_event(1).properties
    includes = [Include.insert({"RowKey": f"i{n}", **wide}) for n in range(5)]
    with pytest.raises(ValueError, match=r"up to \d+ bytes with the header"):
        S.write(Stream(partition), EventData(id="e", properties=wide, includes=includes))
    assert proxy.seen == []
    assert rows(partition) == {}


def test_the_planned_bytes_bound_what_each_runner_sends(proxied_client: Any, proxy: Proxy) -> None:
    # Keys in the URLs, percent-encoded (9 bytes a character), escapes of every
    # length in names and values, ETags, and every kind of include.
    key = "键" * 500
    partition = Partition(proxied_client, key)
    proxy.plan(lambda request: "pass")
    values: dict[str, Any] = {
        "名" * 40: '\x01"\\' * 100 + "\U0001f600" * 100,
        "\U00010400" * 60: b"\xff" * 1000,
        "Big": 2**63 - 1,
        "F": -1.7976931348623157e308,
        "At": datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        "G": uuid.UUID(int=1),
        "T": True,
        "Small": -(2**31),
    }
    stream = S.provision(partition, values)
    S.write(stream, EventData(includes=[Include.insert({"RowKey": f"{key[:400]}{n}", **values})
                                        for n in range(3)]))  # fmt: skip
    stream = S.open(partition)
    includes = [
        Include.replace({"RowKey": f"{key[:400]}0", **values}, etag="*"),
        Include.delete({"RowKey": f"{key[:400]}1"}, etag="*"),
        Include.insert_or_merge({"RowKey": f"{key[:400]}2", **values}),
        Include.insert_or_replace({"RowKey": f"{key[:400]}3", **values}),
    ]
    events = [EventData(id=f"e{n}", properties=values) for n in range(3)]
    events.append(EventData(id="last", properties=values, includes=includes))
    (chunk,) = plan(stream, events, track_changes=True)
    header = header_entity(partition, stream.version + 4, stream.properties)
    url = len(partition.endpoint) + 1 + len(partition.table_name)
    bound = TRANSACTION_BYTES + operation_bytes(url, "update_replace", header)
    bound += sum(operation_bytes(url, op.kind, op.entity, op.etag) for op in chunk.operations)
    proxy.seen.clear()

    S.write(stream, *events)

    (sent,) = _batches(proxy)
    assert sent <= bound, (sent, bound)
    assert bound < 1.5 * sent  # a bound, not a guess far above what is sent


#: A header one property over the limit (252 and its Version), and one over
#: 1 MiB by Azure's formula: provision refused both, a write stored them.
HEADERS_OVER: dict[str, dict[str, PropertyValue]] = {
    "properties": {f"P{i}": i for i in range(252)},
    "bytes": split_binary("S", b"\x03" * 1_050_000),
}


@pytest.mark.parametrize("over", sorted(HEADERS_OVER))
def test_a_write_whose_header_is_over_the_entity_limits_is_refused_before_sending(
    partition: Partition, over: str
) -> None:
    properties = HEADERS_OVER[over]
    limit = "properties; Azure Tables allows 252" if over == "properties" else "bytes; the limit"
    for stream, events in (
        (Stream(partition, properties), [EventData(id="e1")]),
        (Stream(partition), [EventData(id="e1"), EventData(id="e2", stream_properties=properties)]),
    ):
        with pytest.raises(ValueError, match=f"stream header (has|is) .*{limit}"):
            Stream.check_write(stream, *events)
        with pytest.raises(ValueError, match=f"stream header (has|is) .*{limit}"):
            S.write(stream, *events)
    assert rows(partition) == {}


#: Two includes of one row, each within the limits, that fold into one over them.
FOLDS_OVER: dict[str, tuple[dict[str, PropertyValue], dict[str, PropertyValue]]] = {
    "properties": ({f"A{i}": i for i in range(200)}, {f"B{i}": i for i in range(200)}),
    "bytes": (split_binary("X", b"\x01" * 600_000), split_binary("Y", b"\x02" * 600_000)),
}


@pytest.mark.parametrize("over", sorted(FOLDS_OVER))
def test_includes_that_fold_into_one_over_the_entity_limits_are_refused_before_sending(
    partition: Partition, over: str
) -> None:
    # The folded row was sent: 400 properties were stored, 1.2 MB refused by the
    # service as EntityTooLarge and reported as an include's conflict.
    first, second = FOLDS_OVER[over]
    events = [
        EventData(id="e1", includes=[Include.insert_or_merge({"RowKey": "proj", **first})]),
        EventData(id="e2", includes=[Include.insert_or_merge({"RowKey": "proj", **second})]),
    ]
    folded = r"included entity 'proj' \(its includes in one transaction, folded\) (has|is)"
    with pytest.raises(ValueError, match=folded):
        Stream.check_write(Stream(partition), *events)
    with pytest.raises(ValueError, match=folded):
        S.write(Stream(partition), *events)
    assert rows(partition) == {}
    S.write(Stream(partition), events[0])  # each alone fits
    assert sorted(rows(partition)) == ["SS-HEAD", "SS-SE-0000000001", "SS-UID-e1", "proj"]
