"""The async runner: drives a verb to its outcome, performing each request with
the partition's async client, on the wire (``AsyncWireTableClient``) or through
the SDK (``aio.TableClient``), and retrying by the partition's policy."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, cast

import tenacity
from azure.core.exceptions import AzureError
from azure.data.tables.aio import TableClient as AsyncTableClient

from . import _sdk, _tracing
from ._protocol import Done, Parallel, Pause, Request, Steps, advance, pause_seconds, retry_args
from ._retry import DEFAULT_POLICY, RetryPolicy, out_of_time
from ._wire._client_aio import AsyncWireTableClient

__all__ = ["performer", "run"]

T = TypeVar("T")


def performer(
    table: object,
) -> Callable[[Request, float | None], Coroutine[Any, Any, object]] | None:
    """How ``table`` performs a request (None: it is no async client)."""
    if isinstance(table, AsyncWireTableClient):
        return table.perform
    if isinstance(table, AsyncTableClient):
        client = table

        async def perform(request: Request, deadline: float | None) -> object:
            return await _sdk.perform_async(client, request, deadline)

        return perform  # a coroutine function: tenacity awaits only those
    return None


async def run(partition: object, steps: Steps[T]) -> T:
    """Drive a verb to its outcome with the partition's async client."""
    table = getattr(partition, "table", None)
    policy: RetryPolicy = getattr(partition, "retry", DEFAULT_POLICY)
    deadline = policy.deadline()  # of the whole call: every request, retry and pause
    perform = performer(table)
    result: object = None
    error: AzureError | None = None
    while True:
        try:
            request = advance(steps, result, error)
        except Done as done:
            return cast(T, done.value)
        if perform is None:
            steps.close()
            raise TypeError(
                "the partition's table must be an azure.data.tables.aio.TableClient or a "
                f"streamstone_py.aio.AsyncWireTableClient, got {type(table).__name__} "
                "(use streamstone_py.Stream with a sync client)"
            )
        result, error = None, None
        if isinstance(request, Pause):
            seconds = pause_seconds(policy, request)
            if time.monotonic() + seconds >= deadline:
                error = out_of_time(request.error, partition, policy, deadline)
            else:
                await asyncio.sleep(seconds)
            continue

        async def call(request: Request, perform: Any = perform) -> object:
            retrying = tenacity.AsyncRetrying(**retry_args(policy, request, deadline, partition))
            return await retrying(_tracing.attempt_async(table, perform), request, deadline)

        try:
            if isinstance(request, Parallel):
                result = list(await asyncio.gather(*(call(r) for r in request.requests)))
            else:
                result = await call(request)
        except AzureError as exc:
            error = exc
