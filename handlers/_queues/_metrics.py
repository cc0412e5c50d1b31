"""What a queue consumer counts, as OpenTelemetry metrics on the ``handlers``
meter: the figures of :class:`ConsumerStats` as they are counted, and its
poison queue's depth and oldest entry's age.

Every measurement names the queue (``messaging.destination.name``, with
``messaging.system``) and, for the consumer's own, the handler: no message
id, no account and nothing secret.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from azure.core.exceptions import ResourceNotFoundError
from azure.storage.queue import QueueClient
from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from .._messages._metrics import SCOPE, PerProvider

__all__ = ["QueueMetrics"]

_log = logging.getLogger(__name__)

T = TypeVar("T")

#: No well-known ``messaging.system`` names Azure Storage Queues: ours.
SYSTEM: Final = "azure.storage.queues"
#: The most messages a peek shows (it cannot page).
_PEEK: Final = 32
#: A gauge's request is tried once, its wait bounded: the next collection
#: reads again, and a service that does not answer never holds the reader.
_ONCE: Final[dict[str, Any]] = {"retry_total": 0, "connection_timeout": 5, "read_timeout": 5}
#: How long a gauge waits for its readings in all, in seconds: a socket's read
#: timeout bounds each read, not a service that trickles its answer a byte at
#: a time, so the readings run on threads of their own and are waited for this long.
WAIT: float = 5.0

#: The figures of ConsumerStats that are a message's outcome, by outcome.
_OUTCOMES: Final = {
    "completed": "completed",
    "duplicates": "duplicate",
    "abandoned": "abandoned",
    "faulted": "faulted",
    "poisoned": "poisoned",
}

#: The poison queues of the consumers alive; a consumer collected is
#: forgotten with its queue.
_watched: weakref.WeakSet[QueueClient] = weakref.WeakSet()
_watching = threading.Lock()
#: The (queue URL, reading) of the gauges' reads still running.
_reading: set[tuple[str, str]] = set()


def _poison_queues() -> list[QueueClient]:
    """Each watched poison queue once, however many consumers share it."""
    with _watching:
        return list({queue.url: queue for queue in _watched}.values())


def _of(queue: QueueClient) -> dict[str, Any]:
    return {"messaging.system": SYSTEM, "messaging.destination.name": queue.queue_name}


def _read(queue: QueueClient, what: str, read: Callable[[QueueClient], T]) -> T | None:
    """``read(queue)``, or None when it failed (said at DEBUG, never raised
    into the SDK's collection)."""
    try:
        return read(queue)
    except Exception as exc:  # left out of this collection
        _log.debug("poison queue %r not read for its %s: %s", queue.queue_name, what, exc)
        return None


def _bounded(
    what: str, read: Callable[[QueueClient], T], options: CallbackOptions
) -> Iterator[tuple[QueueClient, T]]:
    """Each watched poison queue's ``read``, side by side on daemon threads
    (one that hangs never holds the process at its exit), waited for
    :data:`WAIT` seconds in all (less if the reader allows less); a queue whose
    read of an earlier collection still runs is not read again meanwhile."""
    wait = min(WAIT, options.timeout_millis / 1000)
    deadline = time.monotonic() + wait
    started: list[tuple[QueueClient, threading.Thread, list[T | None]]] = []
    for queue in _poison_queues():
        key = (queue.url, what)
        box: list[T | None] = [None]

        def run(queue: QueueClient = queue, key: tuple[str, str] = key,
                box: list[T | None] = box) -> None:  # fmt: skip
            try:
                box[0] = _read(queue, what, read)
            finally:
                with _watching:
                    _reading.discard(key)

        with _watching:
            if key in _reading:
                _log.debug("poison queue %r: its %s still being read", queue.queue_name, what)
                continue
            _reading.add(key)
        thread = threading.Thread(target=run, name=f"poison {what}", daemon=True)
        thread.start()
        started.append((queue, thread, box))
    for queue, thread, box in started:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            _log.debug("poison queue %r: its %s not read within %s s", queue.queue_name, what,
                       wait)  # fmt: skip
        elif box[0] is not None:
            yield queue, box[0]


def _depth(queue: QueueClient) -> int:
    try:
        return queue.get_queue_properties(**_ONCE).approximate_message_count or 0
    except ResourceNotFoundError:  # not made yet: nothing poisoned
        return 0


def _oldest(queue: QueueClient) -> datetime | None:
    try:
        shown = queue.peek_messages(max_messages=_PEEK, **_ONCE)
    except ResourceNotFoundError:
        return None
    return min((m.inserted_on for m in shown if m.inserted_on), default=None)


def _depths(options: CallbackOptions) -> Iterable[Observation]:
    """One request per poison queue: its approximate message count."""
    for queue, depth in _bounded("depth", _depth, options):
        yield Observation(depth, _of(queue))


def _ages(options: CallbackOptions) -> Iterable[Observation]:
    """One request per poison queue: a peek at its front (the service keeps
    no strict order: the oldest of the 32 it shows); none while it is empty."""
    for queue, first in _bounded("age", _oldest, options):
        if first is None:
            continue
        age = (datetime.now(UTC) - first).total_seconds()
        yield Observation(max(0.0, age), _of(queue))


class _Instruments:
    def __init__(self, meter: metrics.Meter) -> None:
        self.messages = meter.create_counter(
            "streamstone.messages", unit="{message}", description="Messages settled, by outcome"
        )
        self.consumed = meter.create_counter(
            "messaging.client.consumed.messages",
            unit="{message}",
            description="Queue messages received by a consumer",
        )
        self.renewals = meter.create_counter(
            "streamstone.lock.renewals", unit="{renewal}", description="Queue message locks renewed"
        )
        self.lost = meter.create_counter(
            "streamstone.lock.lost", unit="{lock}", description="Queue message locks lost"
        )
        meter.create_observable_gauge(
            "streamstone.poison.depth",
            [_depths],
            unit="{message}",
            description="Entries in a consumer's poison queue, as the service counts them",
        )
        meter.create_observable_gauge(
            "streamstone.poison.oldest_age",
            [_ages],
            unit="s",
            description="How long the oldest entry a poison queue shows has waited",
        )


_instruments = PerProvider(SCOPE, _Instruments)


class QueueMetrics:
    """One consumer's measurements: its figures as they are counted; its
    poison queue watched by the gauges while the consumer lives."""

    def __init__(self, queue: QueueClient, poison: QueueClient, handler: str) -> None:
        self._attributes = {**_of(queue), "streamstone.handler": handler}
        self._poison = poison  # held here: the gauges read it while this lives
        with _watching:
            _watched.add(poison)
        _instruments()  # the gauges exist from now on, not from the first figure

    def add(self, figures: Mapping[str, int]) -> None:
        made = _instruments()
        if made is None:
            return
        for name, value in figures.items():
            if not value:
                continue
            if name in _OUTCOMES:
                made.messages.add(value, {**self._attributes,
                                          "streamstone.outcome": _OUTCOMES[name]})  # fmt: skip
            elif name == "received":
                receive = {**self._attributes, "messaging.operation.name": "receive"}
                made.consumed.add(value, receive)
            elif name == "renewed":
                made.renewals.add(value, self._attributes)
            elif name == "lost_locks":
                made.lost.add(value, self._attributes)
