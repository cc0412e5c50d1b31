"""What a queue consumer does on the queue with each message it received, and
what it tells of it: complete (delete), release (visible again after a
backoff), poison (to the poison queue, then delete); one WARNING line for
every message abandoned, faulted or poisoned, the figures, and the caller's
outcome callback.

The Queue service's faults are waited out through the consumer's queue
breaker, the message kept in hand (its lock renewed): a delete or a poison
entry is tried again until the service answers, so that a fault never costs
a receive. A message poisoned whose delete still failed (its lock lost, or
the consumer stopping) comes again: the settler remembers the ids it
poisoned (the last :data:`REMEMBERED`) and then only deletes it.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any, Final, Literal

from azure.core.exceptions import AzureError, HttpResponseError
from azure.storage.queue import QueueClient

from .._lifecycle import Receive
from .._messages._message import Message
from .._messages._tracing import TraceContext, failed, failed_as
from .._outcome import Outcome
from ._breaker import Breaker
from ._locks import Held, log_gone, lost_lock, message_gone, queue_fault
from ._metrics import QueueMetrics
from ._poison import PoisonEntry, PoisonQueue
from ._spans import queue_span

__all__ = ["Action", "ConsumerStats", "QueueOutcome", "Settler"]

_log = logging.getLogger("handlers._queues._consumer")

#: How many poisoned queue message ids a consumer remembers, to delete one
#: that comes again (its delete failed) without poisoning it a second time.
REMEMBERED: Final = 10_000

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
    #: Moved to the poison queue (entries sent: a message that comes again
    #: after its delete failed is then only deleted, not counted again).
    poisoned: int = 0
    #: Locks extended for work that outlasted half the timeout.
    renewed: int = 0
    #: Scheduled messages received before they were due, hidden again until then.
    deferred: int = 0
    #: Pages :meth:`QueueConsumer.run` lost to a storage error (it carried on).
    receive_errors: int = 0
    #: Times a breaker opened, the storage's or the Queue service's:
    #: receiving paused until it answered.
    outages: int = 0


@dataclass(frozen=True, slots=True)
class NotDeleted:
    """Why a delete left the message in the queue: it may come again."""

    why: str
    #: Its pop receipt was refused (it comes again, to another receive), as
    #: opposed to a failure of the service or the consumer stopping.
    lost_lock: bool


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
        breaker: Breaker,
        stop: threading.Event,
        handler: str,
        trace_context: TraceContext,
    ) -> None:
        self.queue = queue
        self.metrics = QueueMetrics(queue, poison_queue, handler)
        self._span = partial(queue_span, trace_context=trace_context)
        self.poisons = PoisonQueue(poison_queue)
        self.max_dequeue_count = max_dequeue_count
        self.backoff = backoff
        self.on_outcome = on_outcome
        self.breaker = breaker
        self.stop = stop
        self.stats = ConsumerStats()  # since the consumer was made
        self.run_stats = ConsumerStats()  # since the run began
        self._counting = threading.Lock()
        #: Queue message id -> the receive that poisoned it, oldest first.
        self._poisoned: OrderedDict[str, int] = OrderedDict()

    def count(self, **figures: int) -> None:
        with self._counting:
            for stats in (self.stats, self.run_stats):
                for name, value in figures.items():
                    setattr(stats, name, getattr(stats, name) + value)
        self.metrics.add(figures)

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

    def _waiting(self, attempt: Callable[[], object], what: str) -> None:
        """``attempt()`` until the Queue service answers (see ``Breaker.call``)."""
        self.breaker.call(attempt, what, outage=queue_fault, stopping=self.stop.is_set,
                          pause=self.stop.wait)  # fmt: skip

    def _delete(self, held: Held) -> NotDeleted | None:
        """Delete the message, waiting out the Queue service's faults with it
        in hand (renewed, even by a consumer that renews no lock for slow
        work); None once deleted (or found gone: :func:`message_gone`), else
        why not: its lock was lost, the consumer is stopping, or the service
        refused for good."""
        held.kept = True

        def attempt() -> None:
            with held.lock:
                if held.lost is None:
                    self.queue.delete_message(held.id, held.pop_receipt)
                held.done = True

        try:
            self._waiting(attempt, f"delete of queue message {held.id!r}")
        except AzureError as exc:
            with held.lock:
                held.done = True
            if message_gone(exc):
                log_gone(_log, held.id)
                return None
            if isinstance(exc, HttpResponseError) and lost_lock(exc):
                return NotDeleted(f"lock lost before the delete: {exc.message}", lost_lock=True)
            return NotDeleted(f"delete failed: {exc}", lost_lock=False)
        return None if held.lost is None else NotDeleted(held.lost, lost_lock=True)

    def complete(self, held: Held, outcome: Outcome) -> None:
        refusals: list[NotDeleted] = []

        def delete(receive: Receive) -> None:
            refused = self._delete(held)
            if refused is not None:  # in doubt: it may come again, as a duplicate
                refusals.append(refused)
                receive.fault(refused.why)

        # Said inside the span: a log line made there carries the message's trace.
        with self._span("delete", self.queue.queue_name, held, outcome.message) as span:
            Receive(held.id, on_complete=delete).complete()
            if refusals:  # faulted: it comes again, as a duplicate
                failed_as(span, "lost_lock" if refusals[0].lost_lock else "not_deleted")
                self.count(faulted=1, lost_locks=int(refusals[0].lost_lock))
                self.report("faulted", held, outcome.message, refusals[0].why, outcome)
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
        with self._span("abandon", self.queue.queue_name, held, outcome.message):
            Receive(held.id, on_abandon=lambda r: self.release(held, self.later(held))).abandon(
                reason
            )
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
            if held.lost is not None:  # a renewal was refused: counted as the message goes
                self.count(lost_locks=1)
                return
            try:
                self.queue.update_message(held.id, held.pop_receipt, visibility_timeout=seconds)
            except AzureError as exc:
                if isinstance(exc, HttpResponseError) and lost_lock(exc):
                    held.lost = "lock lost before the release"
                    self.count(lost_locks=1)
                elif queue_fault(exc):  # not tried again: its lock running out releases it
                    self.breaker.failed(f"release of queue message {held.id!r}: {exc}")
                else:  # its lock runs out instead: it comes back then
                    _log.warning("message %r: release failed: %s", held.id, exc)

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
        held.kept = True  # its lock renewed while the entry waits for the service
        kind: dict[str, Any] = {"streamstone.outcome": outcome.kind if outcome else None}
        with self._span("poison", self.queue.queue_name, held, message, **kind) as span:
            try:
                self._waiting(lambda: self.poisons.send(entry),
                              f"poisoning queue message {held.id!r}")  # fmt: skip
            except AzureError as exc:  # kept: its lock runs out, it comes again
                failed(span, exc)
                with held.lock:
                    held.done = True
                _log.warning("message %r not poisoned (it comes again): %s", held.id, exc)
                return
            with self._counting:
                self._poisoned[held.id] = held.count
                while len(self._poisoned) > REMEMBERED:
                    self._poisoned.popitem(last=False)
            self.count(poisoned=1)
            self.report("poisoned", held, message, told or reason, outcome)
        self._forget_poisoned(held)

    def poisoned_before(self, held: Held) -> bool:
        """Whether this consumer poisoned the message on an earlier receive
        (its delete failed): then it is deleted now, and not sent again."""
        with self._counting:
            first = self._poisoned.get(held.id)
        if first is None:
            return False
        self.report("poisoned", held, None, f"already in the poison queue (sent on receive "
                    f"{first}, its delete failed): deleted now, not sent again")  # fmt: skip
        self._forget_poisoned(held)
        return True

    def _forget_poisoned(self, held: Held) -> None:
        """Delete a poisoned message; remembered until it is deleted."""
        refused = self._delete(held)
        if refused is None:
            with self._counting:
                self._poisoned.pop(held.id, None)
            return
        self.count(lost_locks=int(refused.lost_lock))
        _log.info("queue message %r: poisoned, not deleted (%s): when it comes again, it is "
                  "deleted, not poisoned again", held.id, refused.why)  # fmt: skip

    def later(self, held: Held) -> int:
        return held.backoff(*self.backoff)
