"""Provisioning, opening, existence and stream properties."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from streamstone_py import (
    ConcurrencyConflictError,
    EventData,
    Partition,
    Stream,
    StreamNotFoundError,
)
from tests.helpers import rows, snapshot


def test_provision_new_stream_stores_only_a_header(partition: Partition) -> None:
    stream = Stream.provision(partition)

    assert stream.version == 0
    assert stream.etag
    assert not stream.is_transient
    assert stream.partition == partition
    assert dict(stream.properties) == {}
    assert rows(partition) == {"SS-HEAD": {"Version": 0}}


def test_provision_existing_stream_conflicts_and_leaves_it(partition: Partition) -> None:
    Stream.provision(partition, {"Owner": "first"})
    before = snapshot(partition)

    with pytest.raises(ConcurrencyConflictError) as caught:
        Stream.provision(partition, {"Owner": "second"})

    assert caught.value.partition == partition
    assert "already exists" in str(caught.value)
    assert snapshot(partition) == before


def test_provision_round_trips_properties_of_every_type(partition: Partition) -> None:
    properties = {
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
    provisioned = Stream.provision(partition, properties)
    opened = Stream.open(partition)

    assert dict(provisioned.properties) == properties
    assert dict(opened.properties) == properties
    assert opened == provisioned
    assert rows(partition)["SS-HEAD"] == {"Version": 0, **properties}


def test_open_existing_stream(partition: Partition) -> None:
    provisioned = Stream.provision(partition, {"Kind": "order"})

    opened = Stream.open(partition)

    assert opened.version == 0
    assert opened.etag == provisioned.etag
    assert dict(opened.properties) == {"Kind": "order"}


def test_open_missing_stream_raises_not_found(partition: Partition) -> None:
    with pytest.raises(StreamNotFoundError) as caught:
        Stream.open(partition)
    assert caught.value.partition == partition
    assert partition.key in str(caught.value)


def test_try_open_and_exists(partition: Partition) -> None:
    assert Stream.try_open(partition) is None
    assert Stream.exists(partition) is False

    Stream.provision(partition)

    opened = Stream.try_open(partition)
    assert opened is not None
    assert opened.version == 0
    assert Stream.exists(partition) is True


def test_set_properties_replaces_them_and_keeps_version(partition: Partition) -> None:
    stream = Stream.write(
        Stream(partition, {"A": 1, "B": "x"}), EventData(id="e1"), EventData(id="e2")
    ).stream

    updated = Stream.set_properties(stream, {"B": "y", "C": 3.5})

    assert updated.version == 2
    assert updated.etag != stream.etag
    assert dict(updated.properties) == {"B": "y", "C": 3.5}
    assert Stream.open(partition) == updated
    assert rows(partition)["SS-HEAD"] == {"Version": 2, "B": "y", "C": 3.5}


def test_set_properties_to_empty_wipes_them(partition: Partition) -> None:
    stream = Stream.provision(partition, {"A": 1})
    updated = Stream.set_properties(stream, {})
    assert dict(Stream.open(partition).properties) == {}
    assert updated.version == 0


def test_set_properties_with_stale_header_conflicts(partition: Partition) -> None:
    stale = Stream.provision(partition, {"A": 1})
    Stream.write(stale, EventData(id="e1"))
    before = snapshot(partition)

    with pytest.raises(ConcurrencyConflictError):
        Stream.set_properties(stale, {"A": 2})

    assert snapshot(partition) == before


def test_set_properties_on_transient_stream_is_refused(partition: Partition) -> None:
    with pytest.raises(ValueError, match="transient"):
        Stream.set_properties(Stream(partition), {"A": 1})
    assert rows(partition) == {}


@pytest.mark.parametrize(
    "name",
    ["PartitionKey", "RowKey", "Timestamp", "ETag", "odata.etag", "Version", "version", "SS_Id"],
)
def test_reserved_stream_property_names_are_refused(partition: Partition, name: str) -> None:
    with pytest.raises(ValueError, match="reserved"):
        Stream.provision(partition, {name: "x"})
    with pytest.raises(ValueError, match="reserved"):
        Stream(partition, {name: "x"})
    stream = Stream.provision(partition)
    with pytest.raises(ValueError, match="reserved"):
        Stream.set_properties(stream, {name: "x"})
    assert rows(partition) == {"SS-HEAD": {"Version": 0}}


def test_stream_header_is_immutable(partition: Partition) -> None:
    stream = Stream(partition, {"A": 1})
    with pytest.raises(AttributeError):
        stream.version = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        stream.properties["A"] = 2  # type: ignore[index]
    assert stream.is_transient
    assert stream.version == 0
    assert stream.etag is None
