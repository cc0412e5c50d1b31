"""The stream verbs as coroutines, over ``azure.data.tables.aio.TableClient``.

The verbs of :class:`streamstone_py.Stream` (but its two scans), with the
same rows, checks, chunking and errors: both run the engine's one
implementation of each verb, only the I/O differs. Headers are ordinary
:class:`streamstone_py.Stream` values::

    from azure.data.tables.aio import TableServiceClient
    from streamstone_py import EventData, Partition
    from streamstone_py import aio

    async with TableServiceClient.from_connection_string(conn) as service:
        table = await service.create_table_if_not_exists("orders")
        partition = Partition(table, "order-42")
        result = await aio.Stream.write(partition, EventData(id="m-1"), expected_version=0)

The async client needs ``aiohttp``, a dependency of this package.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, TypeVar, cast

import tenacity
from azure.core.exceptions import AzureError, ResourceNotFoundError
from azure.data.tables.aio import TableClient as AsyncTableClient

from . import _headers, _maintenance, _plan, _reads, _writes
from ._model import EventData, StreamSlice, WriteResult
from ._partition import Partition
from ._protocol import (
    CreateEntity,
    Done,
    GetEntity,
    Parallel,
    Pause,
    QueryEntities,
    Request,
    Row,
    Steps,
    SubmitTransaction,
    TableOperation,
    UpdateEntity,
    _table_missing,
    advance,
    call_options,
    query_args,
    require_client,
    retry_args,
    sdk_operation,
)
from ._retry import DEFAULT_POLICY, RetryPolicy, raise_as_storage_error
from ._stream import Stream as StreamHeader
from ._values import PropertyValue

__all__ = ["Stream", "run"]

T = TypeVar("T")


async def _execute(
    table: AsyncTableClient, request: Request, deadline: float | None = None
) -> object:
    try:
        return await _send(table, request, call_options(deadline))
    except Exception as exc:
        raise_as_storage_error(exc)


async def _send(table: AsyncTableClient, request: Request, options: dict[str, Any]) -> object:
    match request:
        case GetEntity(partition_key, row_key):
            try:
                entity = await table.get_entity(partition_key, row_key, **options)
            except ResourceNotFoundError as exc:
                if _table_missing(exc):
                    raise
                return None
            return Row(dict(entity), str(entity.metadata["etag"]))
        case QueryEntities(filter=filter, limit=limit):
            rows: list[Row] = []
            async for entity in table.query_entities(filter, **query_args(request, options)):
                if limit is not None and len(rows) >= limit:
                    break
                rows.append(Row(entity, str(entity.metadata["etag"])))
            return rows
        case CreateEntity(entity):
            return str((await table.create_entity(entity, **options))["etag"])
        case UpdateEntity(entity, etag):
            # aiohttp sends an idempotent method (PUT) again by itself when the
            # connection drops, even after the server applied it; a conditional
            # replace then meets its own change (412). As a one-operation
            # transaction (POST) it is never re-sent below the engine, which
            # resolves a lost answer by reading instead.
            operation = TableOperation("update_replace", entity, etag)
            results = await table.submit_transaction([sdk_operation(operation)], **options)
            return str(results[0]["etag"])
        case SubmitTransaction(operations):
            results = await table.submit_transaction(
                [sdk_operation(op) for op in operations], **options
            )
            return [r.get("etag") for r in results]
    raise TypeError(f"unknown request {request!r}")


async def run(partition: object, steps: Steps[T]) -> T:
    """Drive a verb to its outcome with the partition's async ``TableClient``."""
    table = getattr(partition, "table", None)
    policy: RetryPolicy = getattr(partition, "retry", DEFAULT_POLICY)
    result: object = None
    error: AzureError | None = None
    while True:
        try:
            request = advance(steps, result, error)
        except Done as done:
            return cast(T, done.value)
        client = require_client(
            table, AsyncTableClient, "azure.data.tables.aio.TableClient",
            "streamstone_py.Stream with the sync client", steps,
        )  # fmt: skip
        result, error = None, None
        if isinstance(request, Pause):
            await asyncio.sleep(policy.delay(request.attempt))
            continue

        async def call(request: Request, client: AsyncTableClient = client) -> object:
            retrying = tenacity.AsyncRetrying(**retry_args(policy, request))
            return await retrying(_execute, client, request, policy.deadline())

        try:
            if isinstance(request, Parallel):
                result = list(await asyncio.gather(*(call(r) for r in request.requests)))
            else:
                result = await call(request)
        except AzureError as exc:
            error = exc


class Stream:
    """The verbs of :class:`streamstone_py.Stream`, as coroutines.

    Build transient headers with ``streamstone_py.Stream(partition)``; every
    verb here returns the same header type.
    """

    @staticmethod
    async def provision(
        partition: Partition, properties: Mapping[str, PropertyValue] | None = None
    ) -> StreamHeader:
        """Create an empty stream; see :meth:`streamstone_py.Stream.provision`."""
        return await run(partition, _headers.provision(partition, properties, StreamHeader))

    @staticmethod
    async def open(partition: Partition) -> StreamHeader:
        """Read the header; see :meth:`streamstone_py.Stream.open`."""
        return await run(partition, _headers.open_stream(partition, StreamHeader))

    @staticmethod
    async def try_open(partition: Partition) -> StreamHeader | None:
        """Read the header or ``None``; see :meth:`streamstone_py.Stream.try_open`."""
        return await run(partition, _headers.try_open(partition, StreamHeader))

    @staticmethod
    async def exists(partition: Partition) -> bool:
        """True if the stream exists."""
        return await run(partition, _headers.exists(partition))

    @staticmethod
    async def find(partition: Partition, event_id: str) -> int | None:
        """The version of the event with this id; see :meth:`streamstone_py.Stream.find`."""
        return await run(partition, _headers.find(partition, event_id))

    @staticmethod
    async def write(
        target: StreamHeader | Partition,
        *events: EventData,
        expected_version: int | None = None,
        track_changes: bool = True,
    ) -> WriteResult:
        """Append events; see :meth:`streamstone_py.Stream.write`."""
        partition = target.partition if isinstance(target, StreamHeader) else target
        return await run(
            partition,
            _writes.write_to(target, events, expected_version, track_changes, StreamHeader),
        )

    @staticmethod
    def check_write(stream: StreamHeader, *events: EventData, track_changes: bool = True) -> None:
        """Refuse what a write would refuse, sending nothing (not a coroutine); see
        :meth:`streamstone_py.Stream.check_write`."""
        _plan.check_write(stream, events, track_changes)

    @staticmethod
    async def read(
        partition: Partition, start_version: int = 1, slice_size: int = 1000
    ) -> StreamSlice:
        """Read one slice; see :meth:`streamstone_py.Stream.read`."""
        return await run(partition, _reads.read(partition, start_version, slice_size, StreamHeader))

    @staticmethod
    async def set_properties(
        stream: StreamHeader, properties: Mapping[str, PropertyValue]
    ) -> StreamHeader:
        """Replace the properties; see :meth:`streamstone_py.Stream.set_properties`."""
        return await run(stream.partition, _headers.set_properties(stream, properties))

    @staticmethod
    async def truncate(
        stream: StreamHeader, before_version: int, *, batch_size: int = 100
    ) -> StreamHeader:
        """Delete events below a version; see :meth:`streamstone_py.Stream.truncate`."""
        return await run(
            stream.partition, _maintenance.truncate(stream, before_version, batch_size)
        )

    @staticmethod
    async def delete(target: StreamHeader | Partition, *, batch_size: int = 100) -> None:
        """Delete the whole stream, or finish an interrupted delete; see
        :meth:`streamstone_py.Stream.delete`."""
        partition = target.partition if isinstance(target, StreamHeader) else target
        await run(partition, _maintenance.delete(target, batch_size, StreamHeader))
