"""Virtual partitions: many streams in one physical partition, never seeing each other."""

from __future__ import annotations

import re
import uuid

import pytest
from azure.data.tables import TableClient

from streamstone_py import (
    DuplicateEventError,
    EventData,
    Include,
    Partition,
    Stream,
)
from tests.helpers import S, rows


@pytest.fixture
def pair(client: TableClient) -> tuple[Partition, Partition]:
    physical = "tenant-" + uuid.uuid4().hex
    return Partition(client, f"{physical}|orders"), Partition(client, physical, "invoices")


def test_provision_open_and_write_use_prefixed_rows(pair: tuple[Partition, Partition]) -> None:
    orders, invoices = pair
    S.provision(orders, {"Kind": "orders"})
    S.write(Stream(invoices, {"Kind": "invoices"}), EventData(id="m1", properties={"N": 1}))

    assert rows(orders) == {
        "orders|SS-HEAD": {"Version": 0, "Kind": "orders"},
        "invoices|SS-HEAD": {"Version": 1, "Kind": "invoices"},
        "invoices|SS-SE-0000000001": {"Version": 1, "SS_Id": "m1", "N": 1},
        "invoices|SS-UID-m1": {"Version": 1},
    }
    assert dict(S.open(orders).properties) == {"Kind": "orders"}
    assert S.open(invoices).version == 1


def test_streams_do_not_see_each_others_events_ids_or_versions(
    pair: tuple[Partition, Partition],
) -> None:
    orders, invoices = pair
    o = S.write(Stream(orders), *[EventData(id=f"m{i}", properties={"S": "o"}) for i in range(3)])
    # The same ids in the neighbour stream are not duplicates there.
    i = S.write(Stream(invoices), *[EventData(id=f"m{i}", properties={"S": "i"}) for i in range(2)])

    assert [(e.version, e.id, e.properties["S"]) for e in S.read(orders).events] == [
        (1, "m0", "o"), (2, "m1", "o"), (3, "m2", "o"),
    ]  # fmt: skip
    assert [(e.version, e.id, e.properties["S"]) for e in S.read(invoices).events] == [
        (1, "m0", "i"), (2, "m1", "i"),
    ]  # fmt: skip
    with pytest.raises(DuplicateEventError):
        S.write(o.stream, EventData(id="m1"))
    S.write(i.stream, EventData(id="m2"))  # only in the other stream
    # The failed duplicate changed nothing, and the neighbour's write is not ours:
    # the header from before both is still current.
    assert S.write(o.stream, EventData(id="m9")).stream.version == 4


def test_a_write_to_one_stream_does_not_conflict_with_the_other(
    pair: tuple[Partition, Partition],
) -> None:
    orders, invoices = pair
    o = S.provision(orders)
    i = S.provision(invoices)
    S.write(i, EventData(id="x"))
    assert S.write(o, EventData(id="x")).stream.version == 1


@pytest.mark.parametrize(
    "crafted",
    ["orders|SS-HEAD", "orders|x", "a|b|c", "tenant|"],
)
def test_crafted_stream_names_cannot_reach_another_stream(
    client: TableClient, crafted: str
) -> None:
    with pytest.raises(ValueError, match=r"separator|empty"):
        Partition(client, "tenant", crafted)


def test_crafted_ids_and_includes_stay_inside_their_stream(
    pair: tuple[Partition, Partition],
) -> None:
    orders, invoices = pair
    S.provision(invoices)
    before = {k: v for k, v in rows(invoices).items() if k.startswith("invoices|")}
    # An id that spells another stream's header lands under this stream's id prefix.
    S.write(Stream(orders), EventData(id="x|invoices|SS-HEAD"))
    assert "orders|SS-UID-x|invoices|SS-HEAD" in rows(orders)
    with pytest.raises(ValueError, match="reserved for stream rows"):
        Include.insert_or_replace({"RowKey": "invoices|SS-HEAD"})
    assert {k: v for k, v in rows(invoices).items() if k.startswith("invoices|")} == before


@pytest.mark.parametrize("name", ["SS-SE-0000000001", "SS-UID-foo", "SS-HEAD", "SS-"])
def test_virtual_names_that_fall_among_the_plain_streams_rows_are_refused(
    client: TableClient, name: str
) -> None:
    # Rows "SS-SE-0000000001|SS-HEAD"... would sit between the plain stream's
    # event rows: its reads, truncation, deletion and find would take them.
    message = rf"virtual stream name '{name}' starts with 'SS-'"
    with pytest.raises(ValueError, match=message):
        Partition(client, "tenant", name)
    with pytest.raises(ValueError, match=message):
        Partition(client, f"tenant|{name}")


@pytest.mark.parametrize(
    "row_key",
    [
        "orders|SS-SE-0000000001|x",
        "orders|SS-HEAD",
        "orders|SS-UID-m1",
        "orders|SS-",
        "SS-SE-0000000001|x",
        "SS-HEADER",
        "SS-other",
        "|SS-x",
    ],
)
def test_include_row_keys_that_fall_among_stream_rows_are_refused(row_key: str) -> None:
    with pytest.raises(ValueError, match=rf"RowKey '{re.escape(row_key)}' is reserved"):
        Include.insert_or_replace({"RowKey": row_key})


def test_plain_and_virtual_streams_with_near_names_never_touch_each_other(
    client: TableClient,
) -> None:
    physical = "mix-" + uuid.uuid4().hex
    plain = Partition(client, physical)
    near = [Partition(client, physical, name) for name in ("SS", "S", "ss-SE-0000000001", "SR")]
    # None of these can be a stream's row: a stream name holds no "|".
    keys = ("x|ySS-HEAD", "SS", "orders|OB-1", "a|b|SS-HEAD", "orders|OB-x|SS-7")
    includes = [Include.insert({"RowKey": key}) for key in keys]
    events = [EventData(id=f"e{v}", properties={"N": v}) for v in range(1, 5)]
    stream = S.write(
        Stream(plain), *events, EventData(id="foo|SS-HEAD", properties={"N": 5}, includes=includes)
    ).stream
    for other in near:
        S.write(Stream(other), *[EventData(id=f"foo|SS-{v}", properties={"N": v}) for v in (1, 2)])
    neighbours = {k: v for k, v in rows(plain).items() if not k.startswith("SS-")}

    assert [(e.version, e.id) for e in S.read(plain).events] == [
        (1, "e1"), (2, "e2"), (3, "e3"), (4, "e4"), (5, "foo|SS-HEAD"),
    ]  # fmt: skip
    assert [e.version for e in S.read(plain, start_version=4, slice_size=2).events] == [4, 5]
    assert S.find(plain, "foo|SS-HEAD") == 5
    assert [S.find(other, "foo|SS-HEAD") for other in near] == [None] * 4

    S.truncate(stream, 4)

    assert {k: v for k, v in rows(plain).items() if k.startswith("SS-")} == {
        "SS-HEAD": {"Version": 5, "SS_First": 4},
        "SS-SE-0000000004": {"Version": 4, "SS_Id": "e4", "N": 4},
        "SS-SE-0000000005": {"Version": 5, "SS_Id": "foo|SS-HEAD", "N": 5},
        "SS-UID-e4": {"Version": 4},
        "SS-UID-foo|SS-HEAD": {"Version": 5},
    }
    assert {k: v for k, v in rows(plain).items() if not k.startswith("SS-")} == neighbours

    S.delete(S.open(plain))

    assert rows(plain) == neighbours
    assert len(neighbours) == 5 + 4 * 5  # the includes, and each neighbour's 5 rows
    for other in near:
        recorded = S.read(other).events
        assert [(e.version, e.id) for e in recorded] == [(1, "foo|SS-1"), (2, "foo|SS-2")]
