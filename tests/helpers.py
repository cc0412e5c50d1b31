"""Helpers for the behavioural suite, which runs once per client (sync and async).

Tests call the verbs through :data:`S`, which sends them to
``streamstone_py.Stream`` or to ``streamstone_py.aio.Stream`` depending on the
client the partition holds, so one test body checks both. ``rows`` and
``snapshot`` look at the raw table with a sync client, beside the engine.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from azure.data.tables import TableClient
from azure.data.tables.aio import TableClient as AsyncTableClient

from streamstone_py import EventData, Partition, Stream, aio
from streamstone_py._values import from_table

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


S: Any = _Verbs()


def rows(partition: Partition) -> dict[str, dict[str, Any]]:
    """Every row of the partition's physical partition: RowKey -> plain properties."""
    found = raw(partition).query_entities(
        "PartitionKey eq @pk", parameters={"pk": partition.partition_key}
    )
    return {
        e["RowKey"]: {k: from_table(v) for k, v in e.items() if k not in ("PartitionKey", "RowKey")}
        for e in found
    }


def snapshot(partition: Partition) -> dict[str, tuple[dict[str, Any], str]]:
    """Rows with their ETags, to prove a failed write changed nothing at all."""
    found = raw(partition).query_entities(
        "PartitionKey eq @pk", parameters={"pk": partition.partition_key}
    )
    return {e["RowKey"]: (dict(e), e.metadata["etag"]) for e in found}


def write_events(partition: Partition, count: int) -> Stream:
    """A new stream of ``count`` events with ids e1... and a property N = version."""
    events = [EventData(id=f"e{i}", properties={"N": i}) for i in range(1, count + 1)]
    return S.write(Stream(partition), *events).stream  # type: ignore[no-any-return]
