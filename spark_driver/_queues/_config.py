"""The Azure Storage Queues account of the environment: queue names, where
the Queue service is and how to sign in (beside the table's configuration),
one service client per process, the calls that wait out the Queue service's
faults, and the poison queue."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Final, TypeVar

from azure.core.exceptions import AzureError, HttpResponseError
from azure.storage.queue import QueueClient, QueueServiceClient

from handlers import (
    QUEUE_NAME,
    Breaker,
    PoisonEntry,
    PoisonQueue,
    QueueConfig,
    check_queue_name,
    log_gone,
    lost_lock,
    message_gone,
    poison_name_refusal,
    queue_fault,
)

__all__ = [
    "MAX_HIDDEN", "QUEUE_NAME", "QueueConfig", "check_input_queue", "check_queue_name",
    "delete", "lost_lock", "poison", "queue_call", "queue_service", "send_poison",
]  # fmt: skip

T = TypeVar("T")

_log = logging.getLogger(__name__)

#: The longest a queue message may stay hidden, in seconds (seven days).
MAX_HIDDEN: Final = 7 * 24 * 3600


def check_input_queue(name: str, what: str = "queue") -> str:
    """An input queue's name: valid, and short enough that ``<name>-poison`` is too."""
    check_queue_name(name, what)
    too_long = poison_name_refusal(name, None)
    if too_long is not None:
        raise ValueError(too_long)
    return name


_lock = threading.Lock()
#: Keyed by the whole configuration (account and credentials), never by a
#: queue name alone: two accounts may hold queues of the same name.
_services: dict[QueueConfig, QueueServiceClient] = {}


def queue_service() -> QueueServiceClient:
    """This process's client for the environment's Queue service, made once."""
    config = QueueConfig.from_env()
    with _lock:
        service = _services.get(config)
        if service is None:
            service = _services[config] = config.service()
        return service


#: This process's breaker for the Queue service (an executor settling a
#: batch's messages, the source receiving): a fault of the service (no
#: answer, 408, 429, 5xx...) pauses the call and tries it again, so that it
#: costs no receive; one line when it opens, one when it closes.
queueing = Breaker("Queue service", "queue calls pause", log=_log)


def queue_call(attempt: Callable[[], T], what: str) -> T:
    """``attempt()`` until the Queue service answers (``queueing``); a
    refused pop receipt (:func:`lost_lock`) and any other failure raise."""
    return queueing.call(attempt, what, outage=queue_fault)


def delete(queue: QueueClient, message_id: str, pop_receipt: str) -> bool:
    """Delete a queue message, waiting out the service's faults; False when
    its lock was lost (400: it comes again). A message found gone (404
    MessageNotFound: a delete whose answer was lost, the SDK having tried
    it again) is deleted: it does not come again (:func:`message_gone`)."""
    try:
        queue_call(lambda: queue.delete_message(message_id, pop_receipt),
                   f"delete of queue message {message_id!r}")  # fmt: skip
    except HttpResponseError as exc:
        if message_gone(exc):
            log_gone(_log, message_id)
            return True
        if not lost_lock(exc):
            raise
        return False
    return True


def send_poison(queue: QueueClient, entry: PoisonEntry) -> bool:
    """Send ``entry`` to ``<queue>-poison`` (made when missing), waiting out
    the service's faults; False (logged) when it was refused for good."""
    target = PoisonQueue(queue_service().get_queue_client(f"{queue.queue_name}-poison"))
    try:
        queue_call(lambda: target.send(entry),
                   f"poisoning queue message {entry.queue_message_id!r}")  # fmt: skip
    except AzureError as exc:
        _log.warning("queue message %r not poisoned (it comes again): %s",
                     entry.queue_message_id, exc)  # fmt: skip
        return False
    _log.warning("poisoned queue message %r on receive %d to %s-poison: %s",
                 entry.queue_message_id, entry.dequeue_count, queue.queue_name,
                 entry.reason)  # fmt: skip
    return True


def poison(queue: QueueClient, entry: PoisonEntry, pop_receipt: str) -> str:
    """Send ``entry`` to ``<queue>-poison``, then delete the message:
    ``"poisoned"``. ``"kept"`` when the entry could not be sent (the message
    stays, and comes again when its lock runs out); ``"lost"`` when the
    delete found the lock lost (it comes again)."""
    if not send_poison(queue, entry):
        return "kept"
    return "poisoned" if delete(queue, entry.queue_message_id, pop_receipt) else "lost"
