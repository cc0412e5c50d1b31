"""The wire runner against the SDK runner, its reference: random sequences of
verbs, with hostile values, run on two streams, one through each. The stored
rows must be equal (ETags and timestamps aside), and so must every result and
every error."""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from azure.core.exceptions import AzureError
from azure.data.tables import TableClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamstone_py import (
    EventData,
    Include,
    Partition,
    RetryPolicy,
    Stream,
    StreamSlice,
    WireTableClient,
    WriteResult,
)
from streamstone_py._transport._faults import error_code
from tests.helpers import rows

FAST = RetryPolicy(attempts=3, initial_delay=0.01, max_delay=0.05, total_time=10.0)

#: Values at and past the edges of every type the engine stores.
hostile_values = st.one_of(
    st.sampled_from(
        [
            2**63 - 1,
            -(2**63),
            2**31 - 1,
            -(2**31),
            2**31,
            -(2**31) - 1,
            0,
            -1,
            math.nan,
            math.inf,
            -math.inf,
            -0.0,
            5e-324,
            1.7976931348623157e308,
            "",
            "'",
            "''",
            "\U0001f600",
            "a\x00b",
            "\ufffd",
            "é" * 300,
            "x" * 32_767,
            b"",
            b"\x00",
            bytes(range(256)),
            b"\xff" * 65_536,
            True,
            False,
            uuid.UUID(int=0),
            uuid.UUID(int=2**128 - 1),
            datetime(1601, 1, 1, tzinfo=UTC),
            datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
            datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=timezone(timedelta(hours=-7))),
        ]
    ),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.binary(max_size=40),
)
names = st.sampled_from(["A", "B", "Name_1", "x" * 40, "Ünicode"])
properties = st.dictionaries(names, hostile_values, max_size=4)
ids = st.one_of(
    st.none(), st.sampled_from(["e1", "e2", "e3", "x|SS-HEAD", "'quoted'", "\U0001f600", "a b"])
)
events = st.lists(st.builds(lambda i, p: (i, p), ids, properties), min_size=1, max_size=4)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("provision"), properties),
        st.tuples(st.just("write"), events),
        st.tuples(st.just("write_stale"), events),
        st.tuples(st.just("write_include"), st.sampled_from(["insert", "replace", "delete"])),
        st.tuples(st.just("read"), st.integers(1, 6), st.integers(1, 5)),
        st.tuples(st.just("set_properties"), properties),
        st.tuples(st.just("truncate"), st.integers(1, 8)),
        st.tuples(st.just("find"), ids.filter(lambda i: i is not None)),
        st.tuples(st.just("delete")),
    ),
    min_size=1,
    max_size=8,
)


def _value(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return "<nan>"
    if isinstance(v, datetime):
        return v.astimezone(UTC)
    return v


def _stream(s: Stream | None) -> Any:
    if s is None:
        return None
    return (s.version, s.first_version, {k: _value(v) for k, v in s.properties.items()})


def _result(result: Any) -> Any:
    """A verb's result, without what differs by transport (ETags, partitions)."""
    if isinstance(result, Stream):
        return _stream(result)
    if isinstance(result, WriteResult):
        return (_stream(result.stream), [_event(e) for e in result.events])
    if isinstance(result, StreamSlice):
        return (_stream(result.stream), [_event(e) for e in result.events],
                result.is_end_of_stream, result.truncated)  # fmt: skip
    return result


def _event(e: Any) -> Any:
    return (e.version, e.id, {k: _value(v) for k, v in e.properties.items()})


class Side:
    """One stream and the headers its caller holds, through one client."""

    def __init__(self, client: TableClient, key: str) -> None:
        self.partition = Partition(client, key, retry=FAST)
        self.held: Stream | None = None
        self.first: Stream | None = None

    def apply(self, op: tuple[Any, ...]) -> Any:
        name, *args = op
        p = self.partition
        current = Stream.try_open(p)
        match name:
            case "provision":
                self.held = Stream.provision(p, args[0])
                self.first = self.first or self.held
                return self.held
            case "write" | "write_stale":
                header = (self.first if name == "write_stale" else current) or Stream(p)
                evs = [EventData(id=i, properties=props) for i, props in args[0]]
                result = Stream.write(header, *evs)
                self.first = self.first or result.stream
                return result
            case "write_include":
                entity = {"RowKey": "proj", "N": 1}
                include = {
                    "insert": Include.insert(entity),
                    "replace": Include.replace(entity, etag="*"),
                    "delete": Include.delete(entity, etag="*"),
                }[args[0]]
                return Stream.write(current or Stream(p), EventData(includes=[include]))
            case "read":
                return Stream.read(p, args[0], args[1])
            case "set_properties":
                return Stream.set_properties(current or Stream.provision(p), args[0])
            case "truncate":
                return Stream.truncate(current or Stream.provision(p), args[0])
            case "find":
                return Stream.find(p, args[0])
            case "delete":
                return Stream.delete(p)
        raise AssertionError(op)


def outcome(side: Side, op: tuple[Any, ...]) -> Any:
    try:
        return ("ok", _result(side.apply(op)))
    except AzureError as exc:  # the service's own answer: its kind, status and code
        return ("error", type(exc).__name__, getattr(exc, "status_code", None), error_code(exc))
    except Exception as exc:
        text = str(exc).replace(side.partition.partition_key, "<key>")
        return ("error", type(exc).__name__, text)


def stored(side: Side) -> dict[str, Any]:
    return {
        key: {n: _value(v) for n, v in row.items() if n not in ("Timestamp", "PartitionKey")}
        for key, row in rows(side.partition).items()
    }


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(program=operations)
def test_the_wire_runner_does_what_the_sdk_runner_does(
    sdk_table: TableClient, table: TableClient, program: list[tuple[Any, ...]]
) -> None:
    assert isinstance(table, WireTableClient)
    assert not isinstance(sdk_table, WireTableClient)
    key = uuid.uuid4().hex[:10]
    sdk, wire = Side(sdk_table, f"sdk-{key}"), Side(table, f"wire-{key}")
    for op in program:
        expected = outcome(sdk, op)
        assert outcome(wire, op) == expected, op
        assert stored(wire) == stored(sdk), op


@pytest.mark.parametrize("value", [2**63 - 1, -(2**63), math.nan, b"\xff" * 65_536, "é" * 300])
def test_a_hostile_value_reads_back_the_same_through_both(
    sdk_table: TableClient, table: TableClient, value: Any
) -> None:
    key = uuid.uuid4().hex[:10]
    for client in (sdk_table, table):
        partition = Partition(client, key)
        header = Stream.try_open(partition) or Stream(partition)
        Stream.write(header, EventData(id=str(id(client)), properties={"V": value}))
    for client in (sdk_table, table):
        (first, second) = Stream.read(Partition(client, key)).events
        assert _value(first.properties["V"]) == _value(value) == _value(second.properties["V"])
