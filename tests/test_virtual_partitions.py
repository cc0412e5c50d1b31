"""Virtual partitions: many streams in one physical partition, never seeing each other."""

from __future__ import annotations

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
