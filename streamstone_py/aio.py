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

from collections.abc import Mapping

from . import _headers, _maintenance, _plan, _reads, _writes
from ._codec._values import PropertyValue
from ._model import EventData, StreamSlice, WriteResult
from ._partition import Partition
from ._stream import Stream as StreamHeader
from ._transport._runner_aio import performer, run
from ._transport._wire._client_aio import AsyncWireTableClient

__all__ = ["AsyncWireTableClient", "Stream", "performer", "run"]


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
    ) -> WriteResult[StreamHeader]:
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
    ) -> StreamSlice[StreamHeader]:
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
