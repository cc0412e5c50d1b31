"""Reading a key's state with the async client: the newest state, and its history.

The same answers as :meth:`Processor.current_state` and
:meth:`Processor.history`, over ``azure.data.tables.aio.TableClient``::

    from azure.data.tables.aio import TableClient
    from handlers import aio
    from handlers.examples import shooting_range

    async with TableClient.from_connection_string(conn, "games") as table:
        now = await aio.current_state(shooting_range, table, "game-1")
        async for version in aio.history(shooting_range, table, "game-1"):
            print(version.version, version.message_id, version.state)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TypeVar

from azure.data.tables.aio import TableClient as AsyncTableClient

from streamstone_py import Partition, RetryPolicy
from streamstone_py import aio as streams

from ._handler import Handler
from ._outcome import KeyState, KeyVersion
from ._reading import check_page_size, key_state, key_version, next_page

__all__ = ["current_state", "history"]

S = TypeVar("S")


def _partition(
    handler: Handler[S], table: AsyncTableClient, key: str, retry: RetryPolicy | None
) -> Partition:
    return Partition(table, key, handler.name, retry=retry or RetryPolicy())


async def current_state(
    handler: Handler[S], table: AsyncTableClient, key: str, *, retry: RetryPolicy | None = None
) -> KeyState[S]:
    """A key's newest state and version, in one round trip (the header).

    A key never written has version 0 and the handler's initial state.
    """
    partition = _partition(handler, table, key, retry)
    return key_state(handler, key, await streams.Stream.try_open(partition))


async def history(
    handler: Handler[S],
    table: AsyncTableClient,
    key: str,
    *,
    page_size: int = 1000,
    retry: RetryPolicy | None = None,
) -> AsyncIterator[KeyVersion[S]]:
    """Every kept version of a key, oldest first, read ``page_size`` at a time."""
    check_page_size(page_size)
    partition = _partition(handler, table, key, retry)
    stream = await streams.Stream.try_open(partition)
    start: int | None = stream.first_version if stream is not None else None
    while start is not None:
        page = await streams.Stream.read(partition, start, page_size)
        for event in page.events:
            yield key_version(handler, key, event)
        start = next_page(page, start)
