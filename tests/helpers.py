"""Helpers for the behavioural suite, which runs once per client (sync and async).

Tests call the verbs through :data:`S`, which sends them to
``streamstone_py.Stream`` or to ``streamstone_py.aio.Stream`` depending on the
client the partition holds, so one test body checks both. ``rows`` and
``snapshot`` look at the raw table with a sync client, beside the engine.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import pytest
from azure.data.tables import TableClient
from azure.data.tables.aio import TableClient as AsyncTableClient

from streamstone_py import (
    EventData,
    Partition,
    PropertyValue,
    Stream,
    StreamSlice,
    WriteResult,
    aio,
)
from streamstone_py._codec._values import from_table
from streamstone_py._transport import _runner

T = TypeVar("T")

_RAW: dict[str, TableClient] = {}
_loop: asyncio.AbstractEventLoop | None = None


def loop() -> asyncio.AbstractEventLoop:
    """One event loop in a background thread; threads of a test submit to it."""
    global _loop
    if _loop is None:
        _loop = asyncio.new_event_loop()
        threading.Thread(target=_loop.run_forever, name="aio-tests", daemon=True).start()
    return _loop


def wait(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run_coroutine_threadsafe(coroutine, loop()).result(timeout=120)


def azurite_port(connection_string: str, service: str = "Table") -> int:
    """The port of the Table (or ``"Queue"``) service a connection string
    names (Azurite's, on loopback)."""
    endpoint = f"{service}Endpoint=http://127.0.0.1:"
    return int(connection_string.split(endpoint)[1].split("/")[0])


def register_raw(table: TableClient) -> None:
    _RAW[table.table_name] = table


def raw(partition: Partition) -> TableClient:
    """A sync client of the partition's table, to plant or inspect rows directly."""
    return _RAW[partition.table_name]


class _Verbs:
    """``S.write(...)`` runs ``Stream.write`` or ``aio.Stream.write`` to match the client."""

    def __getattr__(self, name: str) -> Any:
        def call(target: Any, *args: Any, **kwargs: Any) -> Any:
            partition = target.partition if isinstance(target, Stream) else target
            if isinstance(getattr(partition, "table", None), AsyncTableClient):
                return wait(getattr(aio.Stream, name)(target, *args, **kwargs))
            return getattr(Stream, name)(target, *args, **kwargs)

        return call


class StreamVerbs(Protocol):
    """What :data:`S` offers: the verbs of ``Stream``, with their sync signatures.

    ``_Verbs`` answers every name through ``__getattr__``, which mypy cannot
    follow; this protocol states the contract, so a test that calls a verb
    with a wrong argument is caught, as it would be against ``Stream``.
    """

    def provision(
        self, partition: Partition, properties: Mapping[str, PropertyValue] | None = None
    ) -> Stream: ...

    def open(self, partition: Partition) -> Stream: ...

    def try_open(self, partition: Partition) -> Stream | None: ...

    def exists(self, partition: Partition) -> bool: ...

    def find(self, partition: Partition, event_id: str) -> int | None: ...

    def write(
        self,
        target: Stream | Partition,
        *events: EventData,
        expected_version: int | None = None,
        track_changes: bool = True,
    ) -> WriteResult[Stream]: ...

    def read(
        self, partition: Partition, start_version: int = 1, slice_size: int = 1000
    ) -> StreamSlice[Stream]: ...

    def set_properties(self, stream: Stream, properties: Mapping[str, PropertyValue]) -> Stream: ...

    def truncate(self, stream: Stream, before_version: int, *, batch_size: int = 100) -> Stream: ...

    def delete(self, target: Stream | Partition, *, batch_size: int = 100) -> None: ...


S = cast(StreamVerbs, _Verbs())


def perform(table: Any, request: Any) -> Any:
    """One engine request on ``table``, with whichever runner its client takes."""
    sync = _runner.performer(table)
    if sync is not None:
        return sync(request, None)
    asynchronous = aio.performer(table)
    assert asynchronous is not None, f"no runner takes {table!r}"
    return wait(asynchronous(request, None))


def rows(partition: Partition) -> dict[str, dict[str, Any]]:
    """Every row of the partition's physical partition: RowKey -> plain properties."""
    found = raw(partition).query_entities(
        "PartitionKey eq @pk", parameters={"pk": partition.partition_key}
    )
    return {
        e["RowKey"]: {k: from_table(v) for k, v in e.items() if k not in ("PartitionKey", "RowKey")}
        for e in found
    }


def snapshot(partition: Partition) -> dict[str, tuple[dict[str, Any], str | None]]:
    """Rows with their ETags, to prove a failed write changed nothing at all."""
    found = raw(partition).query_entities(
        "PartitionKey eq @pk", parameters={"pk": partition.partition_key}
    )
    return {e["RowKey"]: (dict(e), e.metadata["etag"]) for e in found}


def write_events(partition: Partition, count: int) -> Stream:
    """A new stream of ``count`` events with ids e1... and a property N = version."""
    events = [EventData(id=f"e{i}", properties={"N": i}) for i in range(1, count + 1)]
    return S.write(Stream(partition), *events).stream


def drain(queue: Any) -> list[str]:
    """The texts of every visible message of a ``QueueClient``, deleted as read."""
    texts: list[str] = []
    while page := list(queue.receive_messages(messages_per_page=32, visibility_timeout=60)):
        for received in page:
            texts.append(received.content)
            queue.delete_message(received)
    return texts


def report(send: Callable[[bytes], object], work: Callable[[], object]) -> None:
    """Run ``work`` in a child process and send its result, or its error, as JSON."""
    try:
        send(json.dumps({"ok": work()}).encode())
    except BaseException:
        send(json.dumps({"error": traceback.format_exc()}).encode())


def forked(work: Callable[[], object], within: float) -> Any:
    """``work()`` in a child made by ``os.fork``: ``{"ok": result}`` or ``{"error":
    traceback}``; the test fails if the child is still at it after ``within`` s."""
    readable, writable = os.pipe()
    with warnings.catch_warnings():  # Python 3.12 warns of fork() in a threaded process
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        try:
            os.close(readable)
            report(lambda data: os.write(writable, data), work)
        finally:
            os._exit(0)
    os.close(writable)
    deadline = time.monotonic() + within
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(readable)
            pytest.fail(f"the forked child was still at work after {within} s")
        time.sleep(0.05)
    with os.fdopen(readable, "rb") as pipe:
        return json.loads(pipe.read())


def rerun_requests_per_key() -> int:
    """The figure docs/spark-pipeline.md gives a rerun's requests per key
    ("about N"), which the cluster test holds the demo's workload to."""
    found = re.search(
        r"same input sends about (\d+) per key",
        (Path(__file__).resolve().parents[1] / "docs" / "spark-pipeline.md").read_text(),
    )
    assert found is not None
    return int(found[1])
