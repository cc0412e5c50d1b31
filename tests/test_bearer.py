"""Bearer tokens on the wire runner: fetched within the call's deadline, and
fetched again in a child forked while a thread of the parent was fetching one.
Against an Azurite that takes bearer tokens (HTTPS, ``--oauth basic``)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import pytest
from azure.core.credentials import AccessToken
from azure.core.exceptions import ServiceRequestError
from azure.data.tables import TableClient

from azurite.launcher import AzuriteTable
from streamstone_py import EventData, Partition, RetryPolicy, Stream, WireTableClient, aio
from streamstone_py.aio import AsyncWireTableClient
from tests.helpers import forked
from tests.oauth import jwt

POLICY = RetryPolicy(attempts=3, total_time=1.0)
#: What a call may take beyond its total time.
MARGIN = 1.0


class Gate:
    """A token endpoint whose first answer waits for ``release``; the rest are at once."""

    def __init__(self) -> None:
        self.calls = 0
        self.entered = threading.Event()
        self.release = threading.Event()

    def token(self) -> AccessToken:
        return AccessToken(jwt(3600), int(time.time()) + 3600)

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            self.release.wait(5)
        return self.token()


class AsyncGate(Gate):
    """The same, as an async ``TokenCredential`` (azure-identity's ``aio`` ones)."""

    async def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:  # type: ignore[override]
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            while not self.release.is_set():
                await asyncio.sleep(0.01)
        return self.token()


def _clients(azurite: AzuriteTable, table: str, gate: Gate) -> tuple[Any, TableClient]:
    """A wire client that takes its tokens from ``gate`` (async for an
    ``AsyncGate``), and a plain SDK client with the account key."""
    assert azurite.https is not None
    verify = str(azurite.https[0])
    kind = AsyncWireTableClient if isinstance(gate, AsyncGate) else WireTableClient
    bearer = kind(azurite.endpoint, table, credential=gate, connection_verify=verify)
    plain = TableClient.from_connection_string(
        azurite.connection_string, table, connection_verify=verify
    )
    return bearer, plain


def _rows(plain: TableClient, key: str) -> dict[str, dict[str, Any]]:
    found = plain.query_entities("PartitionKey eq @pk", parameters={"pk": key})
    return {e["RowKey"]: {k: v for k, v in e.items() if k != "PartitionKey"} for e in found}


@pytest.mark.parametrize("gate", [Gate(), AsyncGate()], ids=["wire", "wire-async"])
def test_a_token_that_comes_late_ends_the_call_by_its_total_time(
    oauth_azurite: AzuriteTable, oauth_table: str, gate: Gate
) -> None:
    # The token was fetched before the call's deadline was watched: a 6 s
    # get_token held a call 6 s under total_time=2.
    bearer, plain = _clients(oauth_azurite, oauth_table, gate)
    key = "late-" + uuid.uuid4().hex[:8]
    partition = Partition(bearer, key, retry=POLICY)
    write = EventData(id="e1")

    def late() -> float:
        started = time.monotonic()
        with pytest.raises(ServiceRequestError, match="no bearer token"):
            Stream.write(partition, write, expected_version=0)
        return time.monotonic() - started

    async def late_async() -> float:
        started = time.monotonic()
        with pytest.raises(ServiceRequestError, match="no bearer token"):
            await aio.Stream.write(partition, write, expected_version=0)
        elapsed = time.monotonic() - started
        gate.release.set()  # the fetch went on: the next call takes its token
        await aio.Stream.write(partition, write, expected_version=0)
        await bearer.close()
        return elapsed

    if isinstance(gate, AsyncGate):
        elapsed = asyncio.run(late_async())
    else:
        elapsed = late()
        gate.release.set()
        Stream.write(partition, write, expected_version=0)

    assert elapsed < POLICY.total_time + MARGIN, elapsed
    assert gate.calls == 1
    assert _rows(plain, key) == {
        "SS-HEAD": {"RowKey": "SS-HEAD", "Version": 1},
        "SS-SE-0000000001": {"RowKey": "SS-SE-0000000001", "Version": 1, "SS_Id": "e1"},
        "SS-UID-e1": {"RowKey": "SS-UID-e1", "Version": 1},
    }


@pytest.mark.parametrize("gate", [Gate(), AsyncGate()], ids=["wire", "wire-async"])
def test_a_child_forked_while_a_thread_fetches_a_token_fetches_its_own(
    oauth_azurite: AzuriteTable, oauth_table: str, gate: Gate
) -> None:
    # The child inherited the token's lock held by a thread it does not have,
    # and waited for it forever.
    bearer, plain = _clients(oauth_azurite, oauth_table, gate)
    key = "forked-" + uuid.uuid4().hex[:8]
    Stream.write(Stream(Partition(plain, key)), EventData(id="e1"), EventData(id="e2"))
    patient = RetryPolicy(attempts=1, total_time=60.0)  # the parent's thread waits for the gate

    async def open_async() -> None:
        try:
            await aio.Stream.open(Partition(bearer, key, retry=patient))
        finally:
            await bearer.close()

    def parent() -> None:
        if isinstance(gate, AsyncGate):
            asyncio.run(open_async())
        else:
            Stream.open(Partition(bearer, key, retry=patient))

    def child() -> list[Any]:
        partition = Partition(bearer, key, retry=POLICY)
        if isinstance(gate, AsyncGate):
            found = asyncio.run(aio.Stream.read(partition))
        else:
            found = Stream.read(partition)
        return [[e.version, e.id] for e in found.events]

    fetching = threading.Thread(target=parent, daemon=True)
    fetching.start()
    assert gate.entered.wait(10)
    try:
        answer = forked(child, within=10.0)
    finally:
        gate.release.set()
        fetching.join(10)
    assert answer == {"ok": [[1, "e1"], [2, "e2"]]}
    assert not fetching.is_alive()
