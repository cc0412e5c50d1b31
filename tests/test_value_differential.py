"""The wire runner against the SDK runner on values, not verbs: random
properties of every kind a caller may hold (enums and other subclasses,
numpy scalars, Decimal, datetimes at both ends of the range and naive ones,
names of every script, sizes at each limit). For each, both runners store
identical rows that read back equal and of the same type, or both refuse it
before anything is sent, with the same error."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import numpy
from azure.data.tables import TableClient
from hypothesis import HealthCheck, event, given, seed, settings
from hypothesis import strategies as st

from streamstone_py import EventData, Partition, Stream, WireTableClient
from tests.helpers import rows
from tests.test_values import Celsius, Color, Kind, Meters, Permission, Shouty, Stamp, Status


class Quoted(str):
    def __repr__(self) -> str:
        return f"Quoted({str.__repr__(self)})"


@dataclass(frozen=True)
class Token:
    """Stands for a value in examples: the test writes ``VALUES[label]``.
    Hypothesis draws these labels, never the values themselves: it chokes on
    subclasses of str and int among sampled constants, and a value at a size
    limit would make a report a megabyte long."""

    label: str

    def __repr__(self) -> str:
        return f"<{self.label}>"


#: Values whose type is not one of the stored types, though it may derive from
#: one; and values at each size limit and one past it.
VALUES: dict[str, Any] = {
    "Status.PAID": Status.PAID,
    "Color.RED": Color.RED,
    "Kind.BIG": Kind.BIG,
    "Permission.READ|WRITE": Permission.READ | Permission.WRITE,
    "Shouty": Shouty("quiet"),
    "Quoted": Quoted("q"),
    "Meters": Meters(5),
    "Celsius": Celsius(-0.5),
    "Stamp": Stamp(2024, 1, 1, tzinfo=UTC),
    "numpy.float64": numpy.float64(1.5),
    "numpy.float32": numpy.float32(0.25),
    "numpy.int64": numpy.int64(2**40),
    "numpy.int32": numpy.int32(-3),
    "numpy.bool_": numpy.bool_(False),
    "numpy.str_": numpy.str_("n"),
    "numpy.datetime64": numpy.datetime64("2024-01-01T00:00:00"),
    "Decimal": Decimal("1.10"),
    "Decimal NaN": Decimal("NaN"),
    "bytearray": bytearray(b"ab"),
    "memoryview": memoryview(b"cd"),
    "None": None,
    "list": [1],
    "64 KiB of é": "é" * 32_768,
    "64 KiB of é and one": "é" * 32_769,
    "64 KiB of astral": "\U0001f600" * 16_384,
    "64 KiB of astral and one": "\U0001f600" * 16_385,
    "64 KiB of binary": b"\x00" * 65_536,
    "64 KiB of binary and one": b"\x00" * 65_537,
    "a lone surrogate": "a\udc00",
}
tokens = st.sampled_from([Token(label) for label in VALUES])
#: Plain values at and past the edges of their types.
plain_values = st.one_of(
    st.integers(-(2**63) - 2, 2**63 + 1),
    st.sampled_from([2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**63 - 1, -(2**63)]),
    st.floats(),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.booleans(),
    st.uuids(),
)
_ZONES = st.sampled_from(
    [UTC, timezone(timedelta(hours=14)), timezone(timedelta(hours=-12)), ZoneInfo("Europe/Berlin")]
)
#: Datetimes across Python's whole range, so past both ends of the service's.
datetimes = st.one_of(
    st.datetimes(timezones=_ZONES),
    st.datetimes(),  # naive
    st.sampled_from(
        [
            datetime(1601, 1, 1, tzinfo=UTC),
            datetime(1600, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
            datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
            datetime(999, 1, 1, tzinfo=UTC),
            datetime(2024, 10, 27, 2, 30, fold=1, tzinfo=ZoneInfo("Europe/Berlin")),
        ]
    ),
)
values = st.one_of(plain_values, plain_values, tokens, datetimes)  # plain ones twice as often

#: Letters of many scripts, beyond the BMP too.
_SCRIPTS = (
    "AZaz_ÀÿĀž"  # Latin
    "ΑΩαω"  # Greek
    "АЯая"  # Cyrillic
    "אתابي"  # Hebrew, Arabic
    "अनक्ष"  # Devanagari, with a virama
    "กขค"  # Thai
    "一名前値"  # CJK
    "가힣"  # Hangul
    "ｱｲ"  # half-width Katakana
    "\U00010400\U0001d400\U00020000"  # Deseret, mathematical bold, CJK extension B
    "0٣·"  # digits and a middle dot: not at the start
)
names = st.one_of(
    st.builds(str.__add__, st.sampled_from(_SCRIPTS[:-3]), st.text(alphabet=_SCRIPTS, max_size=11)),
    st.text(alphabet=_SCRIPTS, min_size=1, max_size=3),  # some start with a digit
    st.sampled_from(
        [
            "x" * 255,
            "x" * 256,
            "\U00010400" * 127 + "x",
            "\U00010400" * 128,
            "名" * 255,
            "with space",
            "Version",
            "partitionKEY",
        ]
    ),
)
properties = st.dictionaries(names, values, max_size=2)


def _attempt(client: TableClient, key: str, props: dict[str, Any]) -> Any:
    partition = Partition(client, key)
    try:
        Stream.write(Stream(partition), EventData(id="e1", properties=props))
    except Exception as exc:
        return ("refused", type(exc).__name__, str(exc), rows(partition))
    (event,) = Stream.read(partition).events
    stored = {row_key: _typed(row) for row_key, row in rows(partition).items()}
    return ("stored", stored, _typed(dict(event.properties)))


def _typed(found: dict[str, Any]) -> dict[str, Any]:
    """Values with their types, NaN made comparable."""
    return {
        k: (type(v), "nan" if isinstance(v, float) and math.isnan(v) else v)
        for k, v in found.items()
    }


@seed(36)
@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(props=properties)
def test_both_runners_store_identical_rows_or_both_refuse(
    sdk_table: TableClient, table: TableClient, props: dict[str, Any]
) -> None:
    assert isinstance(table, WireTableClient)
    props = {k: VALUES[v.label] if isinstance(v, Token) else v for k, v in props.items()}
    key = uuid.uuid4().hex[:10]
    sdk, wire = _attempt(sdk_table, key, props), _attempt(table, key + "w", props)
    event(sdk[0] if sdk[0] == "stored" else f"refused: {sdk[1]}")
    if sdk[0] == "refused":
        assert wire == sdk  # the same error, and nothing stored by either
        assert sdk[3] == {}
        return
    assert wire[0] == "stored", wire
    assert wire[1] == sdk[1]  # identical rows, as a plain azure-data-tables client reads them
    # Read back through each runner: equal to what was written, and of its type.
    assert wire[2] == sdk[2] == _typed(props)
