"""The one rule for property values, on every client: a value reads back equal
to what was written and of the same type, or it is refused before anything is
sent, with an error that names the property, its type and what to do."""

from __future__ import annotations

import enum
import math
import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import numpy
import pytest
from azure.data.tables import EntityProperty

from streamstone_py import EventData, Include, Partition, Stream, check_row
from tests.helpers import S, raw, rows

#: A value of every accepted type, at the edges of its range.
ACCEPTED: dict[str, Any] = {
    "Text": "héllo \U0001f600",
    "Empty": "",
    "Nul": "a\x00b",
    "Int32Max": 2**31 - 1,
    "Int32Min": -(2**31),
    "Past32": 2**31,
    "Int64Max": 2**63 - 1,
    "Int64Min": -(2**63),
    "Zero": 0,
    "Yes": True,
    "No": False,
    "Float": 0.1,
    "Whole": 2.0,
    "Huge": 1.7976931348623157e308,
    "Tiny": 5e-324,
    "Inf": math.inf,
    "NegInf": -math.inf,
    "Blob": bytes(range(256)),
    "NoBytes": b"",
    "First": datetime(1601, 1, 1, tzinfo=UTC),
    "Last": datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    "Micro": datetime(2026, 5, 6, 7, 8, 9, 123456, tzinfo=UTC),
    "Zoned": datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=timezone(timedelta(hours=5, minutes=30))),
    "Guid": uuid.UUID(int=2**128 - 1),
    "名前": "値",
    "Ünïcödé": 1,
    "\U00010400" * 127 + "a": 2,  # 255 UTF-16 code units, the longest name
}


def _sdk_view(entity: Any) -> dict[str, Any]:
    """A row as a plain azure-data-tables client reads it, Int64 wrappers unwrapped."""
    return {
        k: v.value if isinstance(v, EntityProperty) else v
        for k, v in entity.items()
        if k not in ("PartitionKey", "RowKey", "Version", "SS_Id")
    }


def _same(found: dict[str, Any], written: dict[str, Any]) -> None:
    assert found == written
    for name, value in written.items():
        assert isinstance(found[name], type(value)), (name, type(found[name]))
        if type(value) is not datetime:
            assert type(found[name]) is type(value), name


def test_every_accepted_value_reads_back_equal_and_of_its_type(partition: Partition) -> None:
    S.write(Stream(partition, ACCEPTED), EventData(id="e1", properties=ACCEPTED))
    S.write(S.open(partition), EventData(id="e2", properties={"Nan": math.nan}))

    first, second = S.read(partition).events
    found: dict[str, Any] = dict(first.properties)
    _same(found, ACCEPTED)
    _same(dict(S.open(partition).properties), ACCEPTED)
    assert found["Zoned"].tzinfo == UTC  # the same instant, in UTC
    nan: Any = second.properties["Nan"]
    assert math.isnan(nan)
    sdk = raw(partition)
    _same(_sdk_view(sdk.get_entity(partition.partition_key, "SS-SE-0000000001")), ACCEPTED)
    _same(_sdk_view(sdk.get_entity(partition.partition_key, "SS-HEAD")), ACCEPTED)


class Status(str, enum.Enum):  # noqa: UP042 - the form whose str() is "Status.PAID"
    PAID = "paid"


class Color(enum.StrEnum):
    RED = "red"


class Kind(enum.IntEnum):
    BIG = 7


class Permission(enum.IntFlag):
    READ = 4
    WRITE = 2


class Plain(enum.Enum):
    A = 1


class Shouty(str):
    def __str__(self) -> str:
        return self.upper()


class Meters(int):
    pass


class Celsius(float):
    def __repr__(self) -> str:
        return f"{float(self)} °C"


class Stamp(datetime):
    pass


class Id(uuid.UUID):
    pass


_NEW_YORK = ZoneInfo("America/New_York")

#: Values that would not read back as written, and what the error says to do.
REFUSED: list[tuple[Any, str]] = [
    (Status.PAID, r"Status member .*store its \.value \('paid'\)"),
    (Color.RED, r"Color member .*store its \.value \('red'\)"),
    (Kind.BIG, r"Kind member .*store its \.value \(7\)"),
    (Permission.READ, r"Permission member .*store its \.value \(4\)"),
    (Plain.A, r"Plain member .*store its \.value \(1\)"),
    (Shouty("quiet"), r"Shouty, a subclass of str.*str\.__str__\(value\)"),
    (Meters(5), r"Meters, a subclass of int.*int\(value\)"),
    (Celsius(1.5), r"Celsius, a subclass of float.*float\(value\)"),
    (Stamp(2024, 1, 1, tzinfo=UTC), r"Stamp, a subclass of datetime"),
    (Id(int=1), r"Id, a subclass of UUID.*uuid\.UUID\(int=value\.int\)"),
    (numpy.float64(1.5), r"numpy\.float64.*value\.item\(\)"),
    (numpy.int64(5), r"numpy\.int64.*value\.item\(\)"),
    (numpy.bool_(True), r"numpy\.bool.*value\.item\(\)"),
    (numpy.str_("x"), r"numpy\.str_.*value\.item\(\)"),
    (Decimal("1.10"), r"decimal\.Decimal.*str\(value\)"),
    (bytearray(b"x"), r"bytearray.*bytes\(value\)"),
    (memoryview(b"x"), r"memoryview.*bytes\(value\)"),
    (datetime(999, 12, 31, tzinfo=UTC), r"0999-12-31T00:00:00\+00:00 is outside"),
    (datetime(1600, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), r"1601-01-01 to 9999-12-31"),
    (datetime(1601, 1, 1, tzinfo=timezone(timedelta(hours=1))), r"1601-01-01 to 9999-12-31"),
    (datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-1))), r"1601-01-01 to"),
    (datetime(2024, 1, 1), "must be timezone-aware"),
    (datetime(2024, 11, 3, 1, 30, tzinfo=_NEW_YORK), r"repeated hour.*astimezone"),
    (datetime(2024, 3, 10, 2, 30, tzinfo=_NEW_YORK), r"does not exist .*skipped.*astimezone"),
    ("a\ud800b", r"lone surrogate '\\ud800' at index 1"),
    (None, "cannot store a null"),
    (2**63, "does not fit in 64 bits"),
    (date(2024, 1, 1), "unsupported type date"),
]


_IDS = [f"{n}-{type(value).__name__}" for n, (value, _) in enumerate(REFUSED)]


@pytest.mark.parametrize(("value", "message"), REFUSED, ids=_IDS)
def test_a_value_that_would_not_read_back_is_refused_naming_it(
    table: Any, sdk_table: Any, value: Any, message: str
) -> None:
    builds: dict[str, Callable[[], object]] = {
        "event": lambda: EventData(id="e1", properties={"Bad": value}),
        "stream": lambda: EventData(stream_properties={"Bad": value}),
        "header": lambda: Stream(Partition(table, "k"), {"Bad": value}),
        "include": lambda: Include.insert({"RowKey": "r", "Bad": value}),
        "row": lambda: check_row({"PartitionKey": "p", "RowKey": "r", "Bad": value}, "row"),
    }
    for owner, build in builds.items():
        with pytest.raises((TypeError, ValueError), match=message) as caught:
            build()
        assert "'Bad'" in str(caught.value), owner
    for client in (table, sdk_table):  # and nothing reached either runner
        partition = Partition(client, "refused-" + uuid.uuid4().hex[:8])
        with pytest.raises((TypeError, ValueError), match=message):
            S.provision(partition, {"Bad": value})
        assert rows(partition) == {}


@pytest.mark.parametrize("name", ["\U00010400" * 128, "名" * 256, "x" * 256])
def test_a_name_over_255_utf16_code_units_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="at most 255"):
        EventData(properties={name: 1})
