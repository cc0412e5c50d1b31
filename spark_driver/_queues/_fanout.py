"""Queue requests in flight at once: a micro-batch's receives on the driver,
and its deletes in each task. A request to the Queue service waits mostly on
the service (one message a delete, at most 32 a receive), so a few in flight
take a batch's messages in a fraction of the time of one after another.

Every request still goes through ``queue_call`` (the process's breaker: a
fault pauses it, never poisons). The SDK's clients are safe to call from
several threads at once (each call builds its own request on a shared,
pooled transport), as the ``QueueConsumer``'s workers already do.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Final, TypeVar

from azure.storage.queue import QueueClient, QueueMessage

from ._config import queue_call

__all__ = ["DELETERS", "PAGE", "RECEIVERS", "each", "once", "receive"]

T = TypeVar("T")
R = TypeVar("R")

#: The most messages one receive request takes (the Queue service's limit).
PAGE: Final = 32
#: Receive requests in flight on the driver once a first page came full.
RECEIVERS: Final = 8
#: Settling requests (deletes, releases, poison entries) in flight per task.
#: Both stay within the SDK transport's pool of 10 connections per host: a
#: request beyond it opens a connection of its own and closes it after.
DELETERS: Final = 8


def receive(
    queue: QueueClient, most: int, visibility_timeout: int, receivers: int = RECEIVERS
) -> list[QueueMessage]:
    """Up to ``most`` messages, each received once with a lock of
    ``visibility_timeout`` seconds: a first page alone (an empty queue costs
    one request), then, when it came full, pages of up to 32 over
    ``receivers`` requests in flight until ``most`` are in hand or a page
    comes back empty. Each request asks only for what is left of ``most``
    once the others' asks are counted, so no more than ``most`` are ever
    received; the pages keep the order they were asked in."""
    what = f"receive from queue {queue.queue_name!r}"

    def page(size: int) -> list[QueueMessage]:
        # One request: ``by_page`` stops where ``receive_messages`` would ask again.
        return queue_call(
            lambda: list(next(queue.receive_messages(
                messages_per_page=size, max_messages=size, visibility_timeout=visibility_timeout,
            ).by_page(), [])),
            what,
        )  # fmt: skip

    first = page(min(PAGE, most))
    if len(first) < min(PAGE, most) or len(first) == most:
        # A short page: the queue held no more just now (the next batch takes what comes).
        return first
    lock = threading.Lock()
    left, asked, drained = most - len(first), 0, False
    pages: dict[int, list[QueueMessage]] = {}

    def receiver() -> None:
        nonlocal left, asked, drained
        while True:
            with lock:
                if drained or left <= 0:
                    return
                size, order = min(PAGE, left), asked
                left, asked = left - size, asked + 1
            got = page(size)
            with lock:
                pages[order] = got
                left += size - len(got)
                drained = drained or len(got) < size

    with ThreadPoolExecutor(receivers, "queue-receive") as pool:
        for future in [pool.submit(receiver) for _ in range(receivers)]:
            future.result()  # a failure that is not a fault: the batch fails, nothing deleted
    return once(first + [message for order in sorted(pages) for message in pages[order]])


def once(received: list[QueueMessage]) -> list[QueueMessage]:
    """Each message once, in its first place, as its latest receive (the
    highest dequeue count) took it. A lock shorter than the receive (a slow
    or throttled service) lets another page take a message again: only that
    receive's pop receipt is still honoured, so a batch holding both would
    process the message twice and settle it on a dead receipt."""
    latest: dict[str, QueueMessage] = {}  # a key stays where it was first set
    for message in received:
        kept = latest.get(message.id)
        if kept is None or (message.dequeue_count or 0) > (kept.dequeue_count or 0):
            latest[message.id] = message
    return list(latest.values())


def each(items: Iterable[T], settle: Callable[[T], R], threads: int = DELETERS) -> list[R]:
    """``settle(item)`` for every item, ``threads`` at a time, the results in
    the items' order. Every item is tried before the first failure is raised
    (a settled message must not wait for another's bug to be counted)."""
    work = list(items)
    if len(work) <= 1:
        return [settle(item) for item in work]
    with ThreadPoolExecutor(min(threads, len(work)), "queue-settle") as pool:
        futures = [pool.submit(settle, item) for item in work]
    return [future.result() for future in futures]
