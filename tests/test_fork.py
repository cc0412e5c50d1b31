"""The engine in a forked child: multiprocessing's default start method on
Linux, and prefork servers (gunicorn ``--preload``, celery). A parent reads,
forks, and the child reads, with clients of its own or with the parent's, and
finishes within its policy's time, as the parent goes on reading."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import time
import traceback
import uuid
import warnings
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import pytest
from azure.data.tables import TableClient

from azurite.proxy import Proxy
from streamstone_py import EventData, Partition, RetryPolicy, Stream, WireTableClient, aio
from streamstone_py.aio import AsyncWireTableClient
from tests.helpers import wait

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


def _report(send: Callable[[bytes], object], work: Callable[[], object]) -> None:
    """Run ``work`` in the child and send its result, or its error, as JSON."""
    try:
        send(json.dumps({"ok": work()}).encode())
    except BaseException:
        send(json.dumps({"error": traceback.format_exc()}).encode())


def _forked(work: Callable[[], object]) -> Any:
    """``work()`` in a child made by ``os.fork``; killed if it outlives CHILD_TIME."""
    readable, writable = os.pipe()
    with warnings.catch_warnings():  # Python 3.12 warns of fork() in a threaded process
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        try:
            os.close(readable)
            _report(lambda data: os.write(writable, data), work)
        finally:
            os._exit(0)
    os.close(writable)
    deadline = time.monotonic() + CHILD_TIME
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(readable)
            pytest.fail(f"the forked child was still reading after {CHILD_TIME} s")
        time.sleep(0.05)
    with os.fdopen(readable, "rb") as pipe:
        return json.loads(pipe.read())


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

    answer = _forked(work)

    expected = [list(e) for e in SLICE]
    assert answer == {"ok": {"wire": expected, "sdk": expected, "wire-async": expected}}
    assert _events(Stream.read(Partition(table, stream_key), 3, 2)) == expected  # the parent too


def _child_main(connection_string: str, table: str, key: str, out: Connection) -> None:
    _report(out.send_bytes, lambda: _read_with(_new_clients(connection_string, table), key))


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
    answer = _forked(lambda: _read_with(clients, key))

    assert answer == {"ok": {"wire": expected, "wire-async": expected}}
    assert proxy.connections > before  # the child opened its own
    assert _events(Stream.read(Partition(clients["wire"], key), 3, 2)) == expected
    found = wait(aio.Stream.read(Partition(clients["wire-async"], key), 3, 2))
    assert _events(found) == expected
    clients["wire"].close()
    wait(clients["wire-async"].close())
