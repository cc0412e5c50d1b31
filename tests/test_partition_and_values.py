"""Keys and property values are checked before any request is sent."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable
from datetime import datetime

import pytest
from azure.data.tables import TableClient

from streamstone_py import EventData, Include, Partition, Stream, check_row
from tests.helpers import S, raw, rows


@pytest.mark.parametrize(
    "key",
    [
        "a/b",
        "a\\b",
        "a#b",
        "a?b",
        "tab\there",
        "nl\n",
        "nul\x00",
        "del\x7f",
        "c1\x85",
        "",
        "x" * 513,
    ],
)
def test_bad_partition_keys_are_refused_naming_them(table: TableClient, key: str) -> None:
    with pytest.raises(ValueError, match="partition key") as caught:
        Partition(table, key)
    if key and len(key) < 100:
        assert repr(key) in str(caught.value)


def test_partition_key_must_be_a_string(table: TableClient) -> None:
    with pytest.raises(TypeError, match="must be a str"):
        Partition(table, 42)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad_id", ["a/b", "a#b", "q?", "back\\slash", "\x01", "", "i" * 600])
def test_bad_event_ids_are_refused(bad_id: str) -> None:
    with pytest.raises(ValueError, match="event id"):
        EventData(id=bad_id)


def test_id_too_long_for_its_row_key_is_refused_before_writing(partition: Partition) -> None:
    # 509 characters fit a key alone (1,018 bytes) but not behind "SS-UID-".
    event = EventData(id="i" * 509)
    with pytest.raises(ValueError, match="row key"):
        S.write(Stream(partition), event)
    assert rows(partition) == {}


def test_keys_with_quotes_and_unicode_round_trip(client: TableClient) -> None:
    partition = Partition(client, f"o'neil-ünï-😀-{uuid.uuid4().hex}")
    written = S.write(Stream(partition), EventData(id="it's-✓", properties={"A": 1}))
    assert S.open(partition) == written.stream
    assert [(e.version, e.id) for e in S.read(partition).events] == [(1, "it's-✓")]


def test_longest_key_is_accepted(client: TableClient) -> None:
    key = uuid.uuid4().hex + "k" * (512 - 32)
    partition = Partition(client, key)
    assert S.provision(partition).version == 0


def test_virtual_partition_forms_are_equal_and_prefix_rows(table: TableClient) -> None:
    a = Partition(table, "pk|stream")
    b = Partition(table, "pk", "stream")
    assert a == b
    assert hash(a) == hash(b)
    assert (a.partition_key, a.row_key_prefix, a.key) == ("pk", "stream|", "pk|stream")
    assert a.header_row_key == "stream|SS-HEAD"
    assert a.event_row_key(12) == "stream|SS-SE-0000000012"
    assert a.id_row_key("m1") == "stream|SS-UID-m1"
    for bad, message in [("pk|a|b", "separator"), ("pk|", "empty"), ("|stream", "empty")]:
        with pytest.raises(ValueError, match=message):
            Partition(table, bad)
    with pytest.raises(ValueError, match="separator"):
        Partition(table, "pk", "a|b")


def test_partition_repr_and_immutability(table: TableClient) -> None:
    partition = Partition(table, "k")
    assert repr(partition) == f"Partition(table={table.table_name!r}, key='k')"
    assert str(partition) == f"{table.table_name}.k"
    with pytest.raises(AttributeError):
        partition.partition_key = "other"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "cannot store a null"),
        ([1, 2], "unsupported type list"),
        ({"a": 1}, "unsupported type dict"),
        (2**64, "does not fit in 64 bits"),
        (datetime(2024, 1, 1), "timezone-aware"),
        ("x" * (32 * 1024 + 1), "65538 bytes in UTF-16"),
        (b"x" * (64 * 1024 + 1), "65537 bytes of binary"),
    ],
)
def test_bad_property_values_name_the_property(value: object, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message) as caught:
        EventData(properties={"Bad": value})  # type: ignore[dict-item]
    assert "'Bad'" in str(caught.value)


@pytest.mark.parametrize("name", ["has space", "1st", "dash-ed", "x" * 256, ""])
def test_bad_property_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="not valid"):
        EventData(properties={name: 1})


def test_largest_property_values_are_stored(partition: Partition) -> None:
    text = "é" * (32 * 1024)  # 64 KiB in UTF-16
    blob = bytes(range(256)) * 256  # 64 KiB
    S.write(Stream(partition), EventData(id="big", properties={"Text": text, "Blob": blob}))
    (stored,) = S.read(partition).events
    assert stored.properties == {"Text": text, "Blob": blob}


@pytest.mark.parametrize("key", ["a\ud800", "\udfffb", "\ud83d\ude00"])
def test_a_key_with_a_lone_surrogate_is_refused(table: TableClient, key: str) -> None:
    # Not Unicode text, so not UTF-8: Stream.find failed inside the URL's
    # quoting on both runners, and a write stored by the SDK runner left
    # Azurite answering every later transaction with a 500.
    with pytest.raises(ValueError, match="lone surrogate"):
        EventData(id=key)
    with pytest.raises(ValueError, match="lone surrogate"):
        Partition(table, key)


class Tenant(str, enum.Enum):  # noqa: UP042 - the form whose str() is "Tenant.ACME"
    ACME = "acme"


class Loud(str):
    def __str__(self) -> str:
        return "LOUD"


def test_keys_ids_and_names_that_are_not_exactly_str_are_refused(partition: Partition) -> None:
    # A str subclass travels as its characters in a URL ('acme') and as its
    # str() in a JSON body ('Tenant.ACME'): the stream became unreachable, and
    # a committed write whose answer was lost was reported as a conflict.
    stored = S.write(Stream(partition), EventData(id="e1")).stream
    before = rows(partition)
    table, key = partition.table, partition.partition_key
    refused: list[tuple[Callable[[], object], str]] = [
        (lambda: Partition(table, Tenant.ACME), "partition key"),
        (lambda: Partition(table, key, Tenant.ACME), "virtual stream name"),
        (lambda: EventData(id=Tenant.ACME), "event id"),
        (lambda: Include.insert({"RowKey": Tenant.ACME}), "included entity RowKey"),
        (lambda: EventData(properties={Tenant.ACME: 1}), "property name"),
        (lambda: S.find(partition, Tenant.ACME), "event_id"),
        (lambda: check_row({"PartitionKey": key, "RowKey": Tenant.ACME}, "row"), "RowKey"),
    ]
    for build, what in refused:
        with pytest.raises(TypeError, match=rf"{what} .*Tenant.*store its \.value \('acme'\)"):
            build()
    with pytest.raises(TypeError, match=r"event id .*Loud.*store str\.__str__\(value\)"):
        EventData(id=Loud("x"))
    with pytest.raises(TypeError, match=r"start_key .*Tenant"):
        list(Stream.scan(raw(partition), start_key=Tenant.ACME))
    assert rows(partition) == before
    assert before == {
        "SS-HEAD": {"Version": 1},
        "SS-SE-0000000001": {"Version": 1, "SS_Id": "e1"},
        "SS-UID-e1": {"Version": 1},
    }
    S.write(stored, EventData(id=Tenant.ACME.value))  # what the error says to store
    assert S.find(partition, "acme") == 2
