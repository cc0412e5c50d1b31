"""A key's messages in the executor, as the job hands them over: the result is
the same however the key is cut into chunks, and one key's failure (a
handler error, a storage fault, a state that cannot be read) never stops
another key nor the task."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from azure.data.tables import TableClient, TableServiceClient, UpdateMode

from azurite.proxy import Proxy, Request
from handlers import InMemoryPublisher, Processor
from spark_driver import JobSettings
from spark_driver._tasks._executor import OUTCOME, process_partition
from tests.test_handlers_holes import account

ACCOUNT = "tests.test_handlers_holes:account"


@pytest.fixture
def table_name(connection_string: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("STREAMSTONE_CONNECTION_STRING", connection_string)
    name = "keys" + uuid.uuid4().hex[:12]
    TableServiceClient.from_connection_string(connection_string).create_table(name)
    return name


def row(message_id: str, key: str, type_: str, amount: int) -> dict[str, Any]:
    return {
        "message_id": message_id,
        "key": key,
        "type": type_,
        "body": json.dumps({"amount": amount}),
    }


def outcomes(rows: list[tuple[Any, ...]]) -> list[tuple[str, str, int | None, str | None]]:
    """(message id, status, version, reason) of each outcome row, in order."""
    return [(r[1], r[4], r[5], r[6]) for r in rows if r[0] == OUTCOME]


def run(name: str, rows: list[dict[str, Any]], **settings: Any) -> list[tuple[Any, ...]]:
    job = JobSettings(table=name, handler=ACCOUNT, **settings)
    return list(process_partition(iter(rows), job))


def balance(connection_string: str, name: str, key: str) -> tuple[int, int]:
    with TableClient.from_connection_string(connection_string, name) as client:
        state = Processor(account, client, InMemoryPublisher()).current_state(key)
    return state.version, state.state.balance


# --- 2. a key longer than one chunk stops at its first failure -----------------------


def long_key(key: str) -> list[dict[str, Any]]:
    """499 deposits of 1, a withdrawal the handler refuses, then two that would pass."""
    rows = [row(f"{key}-d{n:03d}", key, "Deposit", 1) for n in range(499)]
    return [
        *rows,
        row(f"{key}-w-big", key, "Withdraw", 1000),
        row(f"{key}-d-big", key, "Deposit", 1000),
        row(f"{key}-w-after", key, "Withdraw", 1000),
    ]


@pytest.mark.parametrize("batch_size", [500, 499, 1000])
def test_a_key_stops_at_its_first_abandoned_message_whatever_the_chunk_size(
    connection_string: str, table_name: str, batch_size: int
) -> None:
    key, other = "acct-long", "acct-other"
    rows = [*long_key(key), row(f"{other}-d", other, "Deposit", 5)]

    found = outcomes(run(table_name, rows, batch_size=batch_size))

    assert found[:499] == [(f"{key}-d{n:03d}", "completed", n + 1, None) for n in range(499)]
    refused = "handler 'Account' failed on message 'acct-long-w-big': ValueError: insufficient "
    assert found[499][:3] == (f"{key}-w-big", "abandoned", None)
    assert str(found[499][3]).startswith(refused + "funds: 499 < 1000")
    for message_id, status, version, reason in found[500:502]:
        assert (status, version) == ("abandoned", None), message_id
        assert str(reason).startswith(
            f"an earlier message of key {key!r} failed: {refused}funds: 499 < 1000"
        ), reason
    assert found[502] == (f"{other}-d", "completed", 1, None)
    assert balance(connection_string, table_name, key) == (499, 499)
    assert balance(connection_string, table_name, other) == (1, 5)


@pytest.fixture
def refusing(connection_string: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Proxy]:
    """The executors' account behind a proxy; each test gives the proxy its plan."""
    port = int(connection_string.split("TableEndpoint=http://127.0.0.1:")[1].split("/")[0])
    with Proxy(port) as proxy:
        monkeypatch.setenv("STREAMSTONE_CONNECTION_STRING", proxy.endpoint_of(connection_string))
        yield proxy


def test_a_key_stops_after_a_faulted_chunk(
    connection_string: str, table_name: str, refusing: Proxy
) -> None:
    key = "acct-faulted"
    rows = [row(f"{key}-d{n}", key, "Deposit", 1) for n in range(7)]
    # Every try of the first chunk's write is refused on the socket; then all pass.
    refused: list[Request] = []

    def plan(request: Request) -> Any:
        if request.method == "POST" and b"$batch" in request.head and len(refused) < 6:
            refused.append(request)
            return "refuse"
        return "pass"

    refusing.plan(plan)

    found = outcomes(run(table_name, rows, batch_size=3))

    assert [(m, s) for m, s, _, _ in found[:3]] == [(f"{key}-d{n}", "faulted") for n in range(3)]
    assert [(m, s, v) for m, s, v, _ in found[3:]] == [
        (f"{key}-d{n}", "abandoned", None) for n in range(3, 7)
    ]
    assert {r for _, _, _, r in found[3:]} == {
        f"not processed: an earlier message 'acct-faulted-d0' of key {key!r} is faulted (in doubt)"
    }
    assert balance(connection_string, table_name, key) == (0, 0)
    # Delivered again, the key is processed in order, exactly once.
    again = outcomes(run(table_name, rows, batch_size=3))
    assert [(m, s, v) for m, s, v, _ in again] == [
        (f"{key}-d{n}", "completed", n + 1) for n in range(7)
    ]


# --- 3. a stored state that cannot be read stops only its own key -------------------


def test_an_unreadable_state_abandons_its_key_and_the_task_goes_on(
    connection_string: str, table_name: str
) -> None:
    first = [row(f"{k}-d0", k, "Deposit", 10) for k in ("acct-a", "acct-b", "acct-c")]
    run(table_name, first)
    with TableClient.from_connection_string(connection_string, table_name) as client:
        client.update_entity(
            {"PartitionKey": "acct-b", "RowKey": "Account|SS-HEAD", "State_00": b"\xc1\x01cut"},
            mode=UpdateMode.MERGE,
        )
    second = [row(f"{k}-d1", k, "Deposit", 1) for k in ("acct-a", "acct-b", "acct-c")]

    found = outcomes(run(table_name, second, concurrency=1))

    assert [(m, s, v) for m, s, v, _ in found] == [
        ("acct-a-d1", "completed", 2),
        ("acct-b-d1", "abandoned", None),
        ("acct-c-d1", "completed", 2),
    ]
    assert str(found[1][3]).startswith(
        "the stored state of key 'acct-b' (handler 'Account') at version 1 cannot be read: "
        "stored value compressed with zlib cannot be decompressed"
    ), found[1][3]
    assert balance(connection_string, table_name, "acct-a") == (2, 11)
