"""The engine in a forked child: multiprocessing's default start method on
Linux, and prefork servers (gunicorn ``--preload``, celery). A parent reads,
forks, and the child reads, with clients of its own or with the parent's, and
finishes within its policy's time, as the parent goes on reading."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import uuid
import warnings
from multiprocessing.connection import Connection
from typing import Any

import pytest
from azure.data.tables import TableClient

from azurite.proxy import Proxy
from streamstone_py import EventData, Partition, RetryPolicy, Stream, WireTableClient, aio
from streamstone_py.aio import AsyncWireTableClient
from tests.helpers import forked, report, wait

POLICY = RetryPolicy(attempts=2, total_time=5.0)
#: The child's reads, each within the policy's time, and its start.
CHILD_TIME = 3 * POLICY.total_time + 5.0
#: Versions 3 and 4 of a stream of five: point reads beside the header read.
SLICE = [(3, "e3"), (4, "e4")]


def _events(found: Any) -> list[list[Any]]:
    return [[e.version, e.id] for e in found.events]


def _read_with(clients: dict[str, Any], key: str) -> dict[str, Any]:
    """Each client's read of the slice, as the child sees it."""
    read: dict[str, Any] = {}
    for name, client in clients.items():
        partition = Partition(client, key, retry=POLICY)
        if isinstance(client, AsyncWireTableClient):
            read[name] = _events(asyncio.run(aio.Stream.read(partition, 3, 2)))
        else:
            read[name] = _events(Stream.read(partition, 3, 2))
    return read


def _new_clients(connection_string: str, table: str) -> dict[str, Any]:
    return {
        "wire": WireTableClient.from_connection_string(connection_string, table),
        "sdk": TableClient.from_connection_string(connection_string, table),
        "wire-async": AsyncWireTableClient.from_connection_string(connection_string, table),
    }


@pytest.fixture
def stream_key(table: TableClient, sdk_table: TableClient, async_wire_table: Any) -> str:
    """A stream of five events, read in the parent through all three runners first,
    so that the parent's thread pool, connections and session exist at the fork."""
    key = "fork-" + uuid.uuid4().hex[:8]
    Stream.write(Stream(Partition(table, key)), *[EventData(id=f"e{n}") for n in range(1, 6)])
    for client in (table, sdk_table):
        assert _events(Stream.read(Partition(client, key), 3, 2)) == [list(e) for e in SLICE]
    found = wait(aio.Stream.read(Partition(async_wire_table, key), 3, 2))
    assert _events(found) == [list(e) for e in SLICE]
    return key


def test_a_child_made_by_os_fork_reads_with_new_clients(
    connection_string: str, table: TableClient, stream_key: str
) -> None:
    def work() -> object:
        return _read_with(_new_clients(connection_string, table.table_name), stream_key)

    answer = forked(work, CHILD_TIME)

    expected = [list(e) for e in SLICE]
    assert answer == {"ok": {"wire": expected, "sdk": expected, "wire-async": expected}}
    assert _events(Stream.read(Partition(table, stream_key), 3, 2)) == expected  # the parent too


def _child_main(connection_string: str, table: str, key: str, out: Connection) -> None:
    report(out.send_bytes, lambda: _read_with(_new_clients(connection_string, table), key))


def test_a_multiprocessing_fork_child_reads_with_new_clients(
    connection_string: str, table: TableClient, stream_key: str
) -> None:
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(
        target=_child_main, args=(connection_string, table.table_name, stream_key, send)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        child.start()
    child.join(CHILD_TIME)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail(f"the child was still reading after {CHILD_TIME} s")
    assert receive.poll(1)
    expected = [list(e) for e in SLICE]
    answer = json.loads(receive.recv_bytes())
    assert answer == {"ok": {"wire": expected, "sdk": expected, "wire-async": expected}}


def test_a_child_reads_with_the_parents_wire_clients_on_connections_of_its_own(
    connection_string: str, table: TableClient, proxy: Proxy
) -> None:
    through = proxy.endpoint_of(connection_string)
    clients: dict[str, Any] = {
        "wire": WireTableClient.from_connection_string(through, table.table_name),
        "wire-async": AsyncWireTableClient.from_connection_string(through, table.table_name),
    }
    key = "fork-" + uuid.uuid4().hex[:8]
    Stream.write(Stream(Partition(table, key)), *[EventData(id=f"e{n}") for n in range(1, 6)])
    expected = [list(e) for e in SLICE]
    assert _events(Stream.read(Partition(clients["wire"], key), 3, 2)) == expected
    found = wait(aio.Stream.read(Partition(clients["wire-async"], key), 3, 2))
    assert _events(found) == expected
    before = proxy.connections

    # The parent's kept-alive sockets are shared with the child: reading on
    # them would mix the two processes' answers.
    answer = forked(lambda: _read_with(clients, key), CHILD_TIME)

    assert answer == {"ok": {"wire": expected, "wire-async": expected}}
    assert proxy.connections > before  # the child opened its own
    assert _events(Stream.read(Partition(clients["wire"], key), 3, 2)) == expected
    found = wait(aio.Stream.read(Partition(clients["wire-async"], key), 3, 2))
    assert _events(found) == expected
    clients["wire"].close()
    wait(clients["wire-async"].close())
