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
import weakref
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from azure.core.exceptions import AzureError, ResourceNotFoundError
from azure.storage.queue import QueueClient
from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from .._messages._metrics import SCOPE, PerProvider

__all__ = ["QueueMetrics"]

_log = logging.getLogger(__name__)

#: No well-known ``messaging.system`` names Azure Storage Queues: ours.
SYSTEM: Final = "azure.storage.queues"
#: The most messages a peek shows (it cannot page).
_PEEK: Final = 32
#: A gauge's request is tried once, its wait bounded: the next collection
#: reads again, and a service that does not answer never holds the reader.
_ONCE: Final[dict[str, Any]] = {"retry_total": 0, "connection_timeout": 5, "read_timeout": 5}

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


def _poison_queues() -> list[QueueClient]:
    """Each watched poison queue once, however many consumers share it."""
    with _watching:
        return list({queue.url: queue for queue in _watched}.values())


def _of(queue: QueueClient) -> dict[str, Any]:
    return {"messaging.system": SYSTEM, "messaging.destination.name": queue.queue_name}


def _depths(options: CallbackOptions) -> Iterable[Observation]:
    """One request per poison queue: its approximate message count."""
    for queue in _poison_queues():
        try:
            depth = queue.get_queue_properties(**_ONCE).approximate_message_count or 0
        except ResourceNotFoundError:  # not made yet: nothing poisoned
            depth = 0
        except AzureError as exc:  # left out of this collection
            _log.debug("poison queue %r not read for its depth: %s", queue.queue_name, exc)
            continue
        yield Observation(depth, _of(queue))


def _ages(options: CallbackOptions) -> Iterable[Observation]:
    """One request per poison queue: a peek at its front (the service keeps
    no strict order: the oldest of the 32 it shows); none while it is empty."""
    now = datetime.now(UTC)
    for queue in _poison_queues():
        try:
            shown = queue.peek_messages(max_messages=_PEEK, **_ONCE)
        except ResourceNotFoundError:
            continue
        except AzureError as exc:
            _log.debug("poison queue %r not read for its age: %s", queue.queue_name, exc)
            continue
        first = min((m.inserted_on for m in shown if m.inserted_on), default=None)
        if first is not None:
            yield Observation(max(0.0, (now - first).total_seconds()), _of(queue))


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
