"""The sync runner: drives a verb to its outcome, performing each request with
the partition's client, on the wire (``WireTableClient``) or through the
SDK (``TableClient``), and retrying by the partition's policy."""

from __future__ import annotations

import contextvars
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar, cast

import tenacity
from azure.core.exceptions import AzureError
from azure.data.tables import TableClient

from . import _sdk, _tracing
from ._protocol import (
    Done,
    Parallel,
    Pause,
    QueryPage,
    Request,
    Row,
    Steps,
    advance,
    pause_seconds,
    query_page,
    retry_args,
)
from ._retry import DEFAULT_POLICY, RetryPolicy, out_of_time
from ._wire._client import WireTableClient

__all__ = ["Target", "pages", "performer", "run"]

T = TypeVar("T")

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _threads() -> ThreadPoolExecutor:
    """Threads for the sync clients' parallel reads (the header beside the events)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="streamstone")
        return _pool


def _forget_threads() -> None:
    # A forked child inherits the pool without its threads (and maybe its
    # lock held): its first parallel read would wait forever. Make both again.
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_threads)


def performer(table: object) -> Callable[[Request, float | None], object] | None:
    """How ``table`` performs a request (None: it is no sync client)."""
    if isinstance(table, WireTableClient):
        return table.perform
    if isinstance(table, TableClient):
        return lambda request, deadline: _sdk.perform(table, request, deadline)
    return None


def run(partition: object, steps: Steps[T]) -> T:
    """Drive a verb to its outcome with the partition's sync client."""
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
                "the partition's table must be an azure.data.tables.TableClient or a "
                f"streamstone_py.WireTableClient, got {type(table).__name__} "
                "(use streamstone_py.aio with an async client)"
            )
        result, error = None, None
        if isinstance(request, Pause):
            seconds = pause_seconds(policy, request)
            if time.monotonic() + seconds >= deadline:
                error = out_of_time(request.error, partition, policy, deadline)
            else:
                time.sleep(seconds)
            continue

        def call(request: Request, perform: Any = perform) -> object:
            retrying = tenacity.Retrying(**retry_args(policy, request, deadline, partition))
            return retrying(_tracing.attempt(table, perform), request, deadline)

        try:
            if isinstance(request, Parallel):
                # Each in the caller's context: its span is the parent of theirs.
                futures = [
                    _threads().submit(contextvars.copy_context().run, call, r)
                    for r in request.requests
                ]
                result = [future.result() for future in futures]
            else:
                result = call(request)
        except AzureError as exc:
            error = exc


@dataclass(frozen=True, slots=True)
class Target:
    """What the runner needs of a call made outside a stream: a client and a policy."""

    table: object
    retry: RetryPolicy


def pages(table: object, retry: RetryPolicy, first: Callable[[], QueryPage]) -> Iterator[list[Row]]:
    """A query's rows a page at a time, each page one call by ``retry``, the next
    asked for only once this one is taken. ``first`` makes the first page's
    request (checking what it is made of) once ``table`` is known to be a sync client."""
    if performer(table) is None:
        raise TypeError(
            "table must be an azure.data.tables.TableClient or a streamstone_py.WireTableClient, "
            f"got {table!r}"
        )
    request = first()
    target = Target(table, retry)
    while True:
        rows, continuation = run(target, query_page(request))
        yield rows
        if continuation is None:
            return
        request = replace(request, continuation=continuation)
