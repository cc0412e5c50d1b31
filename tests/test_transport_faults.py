"""Faults on a real socket, below the SDK, for both clients (through azurite.proxy).

The server applies a write and the connection drops before the answer; a
response is cut after its headers; a server accepts a request and never
answers. Each must end as a success, a definite engine error, or a bounded
failure: never a committed write reported as failed, never a transport
exception leaking out, never a call that outlives its retry policy.
"""

from __future__ import annotations

import enum
import math
import time
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from azure.core import MatchConditions
from azure.core.exceptions import AzureError

from azurite.proxy import Action, Proxy, Request
from streamstone_py import EventData, Partition, RetryPolicy, Stream
from streamstone_py._transport._protocol import OperationKind, TableOperation
from streamstone_py._transport._sdk import sdk_operation
from tests.helpers import S, rows

FAST = RetryPolicy(attempts=4, initial_delay=0.01, max_delay=0.05, total_time=3.0)


@pytest.fixture
def via_proxy(proxied_client: Any) -> Partition:
    """A partition whose client (each of the four) talks to Azurite through the proxy."""
    return Partition(proxied_client, "k-" + uuid.uuid4().hex[:8], retry=FAST)


def once(action: Action, method: str, url_part: str = "") -> Any:
    """A plan: ``action`` for the first matching request, then pass everything."""
    taken: list[Request] = []

    def decide(request: Request) -> Action:
        if not taken and request.method == method and url_part.encode() in request.head:
            taken.append(request)
            return action
        return "pass"

    return decide


def events(n: int) -> list[EventData]:
    return [EventData(id=f"e{i}", properties={"N": i}) for i in range(1, n + 1)]


@pytest.mark.parametrize("action", ["drop", "truncate"])
def test_a_write_applied_then_cut_off_is_reported_as_committed(
    via_proxy: Partition, proxy: Proxy, action: Action
) -> None:
    proxy.plan(once(action, "POST", "$batch"))

    result = S.write(Stream(via_proxy), *events(3))

    assert result.stream.version == 3
    assert [(e.version, e.id) for e in result.events] == [(1, "e1"), (2, "e2"), (3, "e3")]
    assert [a for _, a in proxy.seen].count(action) == 1
    proxy.plan(lambda request: "pass")
    assert [e.id for e in S.read(via_proxy).events] == ["e1", "e2", "e3"]
    assert S.write(result.stream, EventData(id="e4")).stream.version == 4


def test_a_write_refused_before_it_was_sent_is_sent_again(
    via_proxy: Partition, proxy: Proxy
) -> None:
    proxy.plan(once("refuse", "POST", "$batch"))
    result = S.write(Stream(via_proxy), *events(2))
    assert result.stream.version == 2
    assert [e.id for e in S.read(via_proxy).events] == ["e1", "e2"]


def test_a_cut_read_is_retried(via_proxy: Partition, proxy: Proxy) -> None:
    S.write(Stream(via_proxy), *events(5))
    proxy.plan(once("truncate", "GET"))

    page = S.read(via_proxy, 1, 100)

    assert [e.id for e in page.events] == ["e1", "e2", "e3", "e4", "e5"]
    assert [a for _, a in proxy.seen].count("truncate") == 1


def test_a_server_that_never_answers_fails_the_call_within_its_total_time(
    via_proxy: Partition, proxy: Proxy
) -> None:
    S.write(Stream(via_proxy), *events(1))
    proxy.plan(lambda request: "hang")

    started = time.monotonic()
    with pytest.raises(AzureError):
        S.read(via_proxy, 1, 10)
    elapsed = time.monotonic() - started

    assert elapsed < FAST.total_time + 3.0, elapsed


# --- a lost answer on every kind of write, and no blind re-send below the engine ----


#: Values that read back equal but not identical: another time zone, NaN, the
#: ends of Int64, a name and a text beyond ASCII.
ODD_VALUES: dict[str, Any] = {
    "At": datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=timezone(timedelta(hours=-7))),
    "Nan": math.nan,
    "Big": 2**63 - 1,
    "Small": -(2**63),
    "名前": "値\U0001f600",
    "Blob": b"\x00\xff",
    "Id": uuid.UUID(int=7),
}


@pytest.mark.parametrize("action", ["drop", "truncate"])
def test_a_lost_answer_to_a_write_of_odd_values_is_reported_as_committed(
    via_proxy: Partition, proxy: Proxy, action: Action
) -> None:
    proxy.plan(once(action, "POST", "$batch"))

    result = S.write(Stream(via_proxy), EventData(id="e1", properties=ODD_VALUES))

    assert result.stream.version == 1
    proxy.plan(lambda request: "pass")
    (event,) = S.read(via_proxy).events
    stored: dict[str, Any] = dict(event.properties)
    assert math.isnan(stored.pop("Nan"))
    assert stored == {k: v for k, v in ODD_VALUES.items() if k != "Nan"}
    assert stored["At"].tzinfo == UTC
    assert [m for m, _ in writes(proxy)].count("POST") == 1
    row = rows(via_proxy)["SS-SE-0000000001"]  # as a plain azure-data-tables client reads it
    assert math.isnan(row.pop("Nan"))
    assert row == {**stored, "Version": 1, "SS_Id": "e1"}


class Status(str, enum.Enum):  # noqa: UP042 - the form whose str() is "Status.PAID"
    PAID = "paid"


def test_an_enum_is_refused_before_anything_is_sent(via_proxy: Partition, proxy: Proxy) -> None:
    # Stored as its str() it read back as 'Status.PAID', and a write whose
    # answer was lost was then reported as a conflict: refused, nothing is sent.
    proxy.plan(once("drop", "POST", "$batch"))
    with pytest.raises(TypeError, match=r"'S' is a .*Status member.*store its \.value"):
        S.write(Stream(via_proxy), EventData(id="e1", properties={"S": Status.PAID}))
    assert proxy.seen == []
    assert rows(via_proxy) == {}


def writes(proxy: Proxy) -> list[tuple[str, Action]]:
    """The requests seen, as (method, action): writes by their method, reads as GET."""
    return [(request.method, action) for request, action in proxy.seen]


#: An answer lost after the request was applied: dropped, cut in its body, or
#: cut amid its headers before its ETag (which may pass for a whole answer).
CUT_OFF: list[Action] = ["drop", "truncate", "behead"]


@pytest.mark.parametrize("action", CUT_OFF)
def test_a_provision_applied_then_cut_off_is_reported_as_committed(
    via_proxy: Partition, proxy: Proxy, action: Action
) -> None:
    proxy.plan(once(action, "POST"))

    stream = S.provision(via_proxy, {"Color": "red"})

    assert (stream.version, dict(stream.properties)) == (0, {"Color": "red"})
    proxy.plan(lambda request: "pass")
    assert S.open(via_proxy) == stream
    # One insert, then the read that resolved it: nothing sent again.
    assert writes(proxy)[:2] == [("POST", action), ("GET", "pass")]
    assert [m for m, _ in writes(proxy)].count("POST") == 1


@pytest.mark.parametrize("action", CUT_OFF)
def test_set_properties_applied_then_cut_off_is_committed_and_never_sent_twice(
    via_proxy: Partition, proxy: Proxy, action: Action
) -> None:
    stream = S.provision(via_proxy, {"Color": "red"})
    proxy.seen.clear()
    proxy.plan(first_write(action))

    changed = S.set_properties(stream, {"Color": "blue"})

    assert dict(changed.properties) == {"Color": "blue"}
    proxy.plan(lambda request: "pass")
    assert S.open(via_proxy) == changed
    sent = writes(proxy)
    assert sent[1] == ("GET", "pass"), sent  # the engine's read resolved it
    assert [m for m, _ in sent if m != "GET"] == [sent[0][0]], sent


@pytest.mark.parametrize("kind", ["update_replace", "update_merge", "delete"])
def test_a_conditional_operation_never_goes_without_its_etag(kind: OperationKind) -> None:
    # An empty ETag once fell back to If-Match: * (unconditional) on the wire.
    entity = {"PartitionKey": "p", "RowKey": "SS-HEAD"}
    for missing in ("", None):
        with pytest.raises(ValueError, match="without an ETag"):
            TableOperation(kind, entity, missing)
    assert sdk_operation(TableOperation(kind, entity, "*"))[-1]["match_condition"] == (
        MatchConditions.Unconditionally
    )


def test_a_write_on_a_closed_connection_is_sent_again_only_after_the_read(
    via_proxy: Partition, proxy: Proxy
) -> None:
    stream = S.provision(via_proxy, {"Color": "red"})
    proxy.seen.clear()
    proxy.plan(first_write("refuse"))

    changed = S.set_properties(stream, {"Color": "green"})

    assert dict(S.open(via_proxy).properties) == {"Color": "green"} == dict(changed.properties)
    method = writes(proxy)[0][0]
    assert writes(proxy)[:3] == [(method, "refuse"), ("GET", "pass"), (method, "pass")]


def first_write(action: Action) -> Any:
    """A plan: ``action`` for the first request that is not a read, then pass everything."""
    taken: list[Request] = []

    def decide(request: Request) -> Action:
        if not taken and request.method != "GET":
            taken.append(request)
            return action
        return "pass"

    return decide


# --- throttling: 503 with Retry-After ------------------------------------------------


def test_a_throttled_write_waits_as_asked_and_is_applied_once(
    via_proxy: Partition, proxy: Proxy
) -> None:
    throttled: list[Request] = []

    def decide(request: Request) -> Action:
        if request.method != "GET" and len(throttled) < 2:
            throttled.append(request)
            return "throttle"
        return "pass"

    proxy.plan(decide)
    started = time.monotonic()

    result = S.write(Stream(via_proxy), *events(3))

    elapsed = time.monotonic() - started
    assert result.stream.version == 3
    assert elapsed >= 2 * proxy.retry_after, elapsed  # each 503 asked for a second
    assert [e.id for e in S.read(via_proxy).events] == ["e1", "e2", "e3"]
    assert sorted(rows(via_proxy)) == [
        "SS-HEAD", "SS-SE-0000000001", "SS-SE-0000000002", "SS-SE-0000000003",
        "SS-UID-e1", "SS-UID-e2", "SS-UID-e3",
    ]  # fmt: skip
    # Each 503 was answered by a read (nothing applied), then the write went again.
    methods = [(r.method, action) for r, action in proxy.seen]
    write = methods[0][0]
    assert methods[:6] == [
        (write, "throttle"), ("GET", "pass"), (write, "throttle"), ("GET", "pass"),
        (write, "pass"), methods[5],
    ]  # fmt: skip


def test_a_throttled_read_waits_as_asked(via_proxy: Partition, proxy: Proxy) -> None:
    S.write(Stream(via_proxy), *events(2))
    proxy.plan(once("throttle", "GET"))
    started = time.monotonic()

    page = S.read(via_proxy, 1, 10)

    assert [e.id for e in page.events] == ["e1", "e2"]
    assert time.monotonic() - started >= proxy.retry_after
