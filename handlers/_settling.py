"""What a queue consumer does on the queue with each message it received, and
what it tells of it: complete (delete), release (visible again after a
backoff), poison (to the poison queue, then delete); one WARNING line for
every message abandoned, faulted or poisoned, the figures, and the caller's
outcome callback.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from azure.core.exceptions import AzureError, HttpResponseError
from azure.storage.queue import QueueClient

from ._lifecycle import Receive
from ._locks import Held, lost_lock
from ._message import Message
from ._outcome import Outcome
from ._poison import PoisonEntry, PoisonQueue

__all__ = ["Action", "ConsumerStats", "QueueOutcome", "Settler"]

_log = logging.getLogger("handlers._consumer")

Action = Literal[
    "completed", "duplicate", "abandoned", "faulted", "poisoned", "deferred", "released"
]


@dataclass(slots=True)
class ConsumerStats:
    """What a consumer did to the queue messages it received: ``consumer.stats``
    since the consumer was made, and what :meth:`QueueConsumer.run` returns,
    during that run only."""

    received: int = 0
    #: Processed, then deleted.
    completed: int = 0
    #: Recognised as a duplicate (outputs published again), then deleted.
    duplicates: int = 0
    #: A handler failed: visible again after a backoff.
    abandoned: int = 0
    #: In doubt: a lost lock (the message comes again), or storage away (the
    #: message kept in hand and tried again once storage answers).
    faulted: int = 0
    #: The faults that were a lost lock: a delete, renewal or release refused
    #: because the pop receipt no longer held.
    lost_locks: int = 0
    #: Moved to the poison queue.
    poisoned: int = 0
    #: Locks extended for work that outlasted half the timeout.
    renewed: int = 0
    #: Scheduled messages received before they were due, hidden again until then.
    deferred: int = 0
    #: Pages :meth:`QueueConsumer.run` lost to a storage error (it carried on).
    receive_errors: int = 0
    #: Times the storage breaker opened: receiving paused until storage answered.
    outages: int = 0


@dataclass(frozen=True, slots=True)
class QueueOutcome:
    """What became of one received queue message, as the consumer's
    ``on_outcome`` callback hears it."""

    action: Action
    queue_message_id: str
    #: Its receive: the queue's dequeue count.
    dequeue_count: int
    #: The message's id and key, when its text is a message.
    message_id: str | None
    key: str | None
    reason: str | None = None
    #: The processor's outcome, when the message was processed.
    outcome: Outcome | None = None


class Settler:
    """The queue operations of a consumer's messages, their counts and reports."""

    def __init__(
        self,
        queue: QueueClient,
        poison_queue: QueueClient,
        max_dequeue_count: int,
        backoff: tuple[timedelta, timedelta],
        on_outcome: Callable[[QueueOutcome], None] | None,
    ) -> None:
        self.queue = queue
        self.poisons = PoisonQueue(poison_queue)
        self.max_dequeue_count = max_dequeue_count
        self.backoff = backoff
        self.on_outcome = on_outcome
        self.stats = ConsumerStats()  # since the consumer was made
        self.run_stats = ConsumerStats()  # since the run began
        self._counting = threading.Lock()

    def count(self, **figures: int) -> None:
        with self._counting:
            for stats in (self.stats, self.run_stats):
                for name, value in figures.items():
                    setattr(stats, name, getattr(stats, name) + value)

    def new_run(self) -> ConsumerStats:
        with self._counting:
            self.run_stats = ConsumerStats()
            return self.run_stats

    def report(
        self,
        action: Action,
        held: Held,
        message: Message | None,
        reason: str | None = None,
        outcome: Outcome | None = None,
    ) -> None:
        """The one line (WARNING for a message not completed) and the callback."""
        if action in ("abandoned", "faulted", "poisoned"):
            what = (
                f"message {message.id!r} of key {message.key!r}"
                if message is not None
                else f"queue message {held.id!r}"
            )
            _log.warning("%s %s on receive %d of %d: %s", action, what, held.count,
                         self.max_dequeue_count, reason)  # fmt: skip
        elif action in ("deferred", "released"):
            _log.info("%s queue message %r: %s", action, held.id, reason)
        if self.on_outcome is None:
            return
        record = QueueOutcome(
            action, held.id, held.count, None if message is None else message.id,
            None if message is None else message.key, reason, outcome,
        )  # fmt: skip
        try:
            self.on_outcome(record)
        except Exception:  # the caller's callback never stops the consumer
            _log.exception("the on_outcome callback failed on %r", record)

    # --- the lifecycle on the queue -------------------------------------------------

    def complete(self, held: Held, outcome: Outcome) -> None:
        def delete(receive: Receive) -> None:
            with held.lock:
                held.done = True
                if held.lost is not None:
                    receive.fault(held.lost)
                    return
                try:
                    self.queue.delete_message(held.id, held.pop_receipt)
                except HttpResponseError as exc:
                    if not lost_lock(exc):
                        raise
                    receive.fault(f"lock lost before the delete: {exc.message}")

        receive = Receive(held.id, on_complete=delete)
        try:
            receive.complete()
        except AzureError as exc:  # in doubt: it may come again, as a duplicate
            receive.fault(f"delete failed: {exc}")
        if receive.reason is not None:  # faulted: it comes again, as a duplicate
            self.count(faulted=1, lost_locks=int(receive.reason.startswith("lock lost")))
            self.report("faulted", held, outcome.message, receive.reason, outcome)
        elif outcome.status == "duplicate":
            self.count(duplicates=1)
            self.report("duplicate", held, outcome.message, None, outcome)
        else:
            self.count(completed=1)
            self.report("completed", held, outcome.message, None, outcome)

    def fail(self, held: Held, outcome: Outcome) -> None:
        """A failure of the message: poisoned on its last allowed receive, else
        abandoned (visible again after a backoff doubled per receive)."""
        reason = outcome.reason or outcome.kind
        if held.count >= self.max_dequeue_count:
            self.poison(
                held,
                outcome.message,
                f"failed on receive {held.count} of {self.max_dequeue_count}: {reason}",
                outcome,
                told=reason,
            )
            return
        Receive(held.id, on_abandon=lambda r: self.release(held, self.later(held))).abandon(reason)
        self.count(abandoned=1)
        self.report("abandoned", held, outcome.message, reason, outcome)

    def fault(self, held: Held, message: Message, outcome: Outcome) -> None:
        """Storage away: the message is kept in hand, its lock renewed, and
        tried again; said once."""
        held.kept = True
        Receive(held.id).fault(outcome.reason or "faulted")
        self.count(faulted=1)
        self.report("faulted", held, message, f"kept until storage answers: {outcome.reason}",
                    outcome)  # fmt: skip

    def release(self, held: Held, seconds: int, message: Message | None = None,
                why: str | None = None) -> None:  # fmt: skip
        """Make the message visible in ``seconds`` (0: at once), if its lock still holds."""
        if why is not None:
            self.report("released", held, message, why)
        with held.lock:
            held.done = True
            if held.lost is not None:
                return
            try:
                self.queue.update_message(held.id, held.pop_receipt, visibility_timeout=seconds)
            except AzureError as exc:
                if not isinstance(exc, HttpResponseError) or not lost_lock(exc):
                    # Its lock runs out instead: it comes back then.
                    _log.warning("message %r: release failed: %s", held.id, exc)
                    return
                held.lost = "lock lost before the release"
                self.count(lost_locks=1)

    def poison(
        self,
        held: Held,
        message: Message | None,
        reason: str,
        outcome: Outcome | None = None,
        *,
        told: str | None = None,
    ) -> None:
        """Send the message to the poison queue with ``reason``, then delete it;
        ``told``: the reason as the log line says it (without the receive)."""
        entry = PoisonEntry(reason, held.text, self.queue.queue_name, held.id, held.count)
        if not self.poisons.send(entry):  # kept: its lock runs out, it comes again
            with held.lock:
                held.done = True
            return
        self.count(poisoned=1)
        self.report("poisoned", held, message, told or reason, outcome)
        with held.lock:
            held.done = True
            try:
                self.queue.delete_message(held.id, held.pop_receipt)
            except AzureError as exc:
                # It comes again and is poisoned again: one more entry for the same text.
                if isinstance(exc, HttpResponseError) and lost_lock(exc):
                    self.count(lost_locks=1)
                else:
                    _log.warning("message %r: poisoned but not deleted: %s", held.id, exc)

    def later(self, held: Held) -> int:
        return held.backoff(*self.backoff)
