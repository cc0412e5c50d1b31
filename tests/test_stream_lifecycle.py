"""Provisioning, opening, existence and stream properties."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from azure.data.tables import TableClient

from streamstone_py import (
    ConcurrencyConflictError,
    EventData,
    Partition,
    PropertyValue,
    Stream,
    StreamNotFoundError,
    aio,
)
from tests.helpers import S, rows, snapshot, wait


def test_provision_new_stream_stores_only_a_header(partition: Partition) -> None:
    stream = S.provision(partition)

    assert stream.version == 0
    assert stream.etag
    assert not stream.is_transient
    assert stream.partition == partition
    assert dict(stream.properties) == {}
    assert rows(partition) == {"SS-HEAD": {"Version": 0}}


def test_provision_existing_stream_conflicts_and_leaves_it(partition: Partition) -> None:
    S.provision(partition, {"Owner": "first"})
    before = snapshot(partition)

    with pytest.raises(ConcurrencyConflictError) as caught:
        S.provision(partition, {"Owner": "second"})

    assert caught.value.partition == partition
    assert "already exists" in str(caught.value)
    assert snapshot(partition) == before


def test_provision_round_trips_properties_of_every_type(partition: Partition) -> None:
    properties: dict[str, PropertyValue] = {
        "Text": "héllo ✓",
        "Small": 7,
        "Large": 2**40,
        "Negative": -(2**63),
        "Ratio": 0.25,
        "Flag": True,
        "Blob": b"\x00\xff",
        "When": datetime(2024, 2, 29, 12, 30, 1, 123456, tzinfo=UTC),
        "Ref": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    }
    provisioned = S.provision(partition, properties)
    opened = S.open(partition)

    assert dict(provisioned.properties) == properties
    assert dict(opened.properties) == properties
    assert opened == provisioned
    assert rows(partition)["SS-HEAD"] == {"Version": 0, **properties}


def test_open_existing_stream(partition: Partition) -> None:
    provisioned = S.provision(partition, {"Kind": "order"})

    opened = S.open(partition)

    assert opened.version == 0
    assert opened.etag == provisioned.etag
    assert dict(opened.properties) == {"Kind": "order"}


def test_open_missing_stream_raises_not_found(partition: Partition) -> None:
    with pytest.raises(StreamNotFoundError) as caught:
        S.open(partition)
    assert caught.value.partition == partition
    assert partition.key in str(caught.value)


def test_try_open_and_exists(partition: Partition) -> None:
    assert S.try_open(partition) is None
    assert S.exists(partition) is False

    S.provision(partition)

    opened = S.try_open(partition)
    assert opened is not None
    assert opened.version == 0
    assert S.exists(partition) is True


def test_set_properties_replaces_them_and_keeps_version(partition: Partition) -> None:
    stream = S.write(
        Stream(partition, {"A": 1, "B": "x"}), EventData(id="e1"), EventData(id="e2")
    ).stream

    updated = S.set_properties(stream, {"B": "y", "C": 3.5})

    assert updated.version == 2
    assert updated.etag != stream.etag
    assert dict(updated.properties) == {"B": "y", "C": 3.5}
    assert S.open(partition) == updated
    assert rows(partition)["SS-HEAD"] == {"Version": 2, "B": "y", "C": 3.5}


def test_set_properties_to_empty_wipes_them(partition: Partition) -> None:
    stream = S.provision(partition, {"A": 1})
    updated = S.set_properties(stream, {})
    assert dict(S.open(partition).properties) == {}
    assert updated.version == 0


def test_set_properties_with_stale_header_conflicts(partition: Partition) -> None:
    stale = S.provision(partition, {"A": 1})
    S.write(stale, EventData(id="e1"))
    before = snapshot(partition)

    with pytest.raises(ConcurrencyConflictError):
        S.set_properties(stale, {"A": 2})

    assert snapshot(partition) == before


def test_set_properties_on_transient_stream_is_refused(partition: Partition) -> None:
    with pytest.raises(ValueError, match="transient"):
        S.set_properties(Stream(partition), {"A": 1})
    assert rows(partition) == {}


@pytest.mark.parametrize(
    "name",
    ["PartitionKey", "RowKey", "Timestamp", "ETag", "odata.etag", "Version", "version", "SS_Id"],
)
def test_reserved_stream_property_names_are_refused(partition: Partition, name: str) -> None:
    with pytest.raises(ValueError, match="reserved"):
        S.provision(partition, {name: "x"})
    with pytest.raises(ValueError, match="reserved"):
        Stream(partition, {name: "x"})
    stream = S.provision(partition)
    with pytest.raises(ValueError, match="reserved"):
        S.set_properties(stream, {name: "x"})
    assert rows(partition) == {"SS-HEAD": {"Version": 0}}


def test_stream_header_is_immutable(partition: Partition) -> None:
    stream = Stream(partition, {"A": 1})
    with pytest.raises(AttributeError):
        stream.version = 3
    with pytest.raises(TypeError):
        stream.properties["A"] = 2  # type: ignore[index]
    assert stream.is_transient
    assert stream.version == 0
    assert stream.etag is None


def test_verbs_refuse_the_other_kind_of_client(table: TableClient, async_table: object) -> None:
    sync_partition = Partition(table, "p-" + uuid.uuid4().hex)
    async_partition = Partition(async_table, "p-" + uuid.uuid4().hex)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"streamstone_py\.aio"):
        Stream.provision(async_partition)
    with pytest.raises(TypeError, match=r"streamstone_py\.Stream"):
        wait(aio.Stream.provision(sync_partition))
    assert rows(sync_partition) == {}
    assert rows(async_partition) == {}
