"""A queue consumer: Azure Storage Queue messages through the receive lifecycle.

A queue message is received with a visibility timeout: it stays on the queue,
hidden from other receivers, until the timeout runs out. That is a peek-lock
receive, and each one is a :class:`Receive`:

- **complete**: the message was processed, or recognised as a duplicate, its
  outputs published; it is deleted with its pop receipt;
- **abandon**: the handler failed on it; it is made visible again after a
  backoff, to be received again (and poisoned after too many receives);
- **fault**: the lock was lost (the pop receipt no longer holds: another
  receiver may have it) or storage failed in doubt. The message comes back,
  is recognised as a duplicate, its outputs published again, identical.

Locks are renewed while work outlasts them. A text that is not a message,
or one received over ``max_dequeue_count`` times, is poisoned (``_poison``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any, Final

from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
)
from azure.storage.queue import QueueClient, QueueMessage

from ._lifecycle import Receive
from ._locks import Held, LockRenewal, lost_lock, signals_call, text_of
from ._message import Message
from ._outcome import ConsumerStats, Outcome, utcnow
from ._poison import PoisonEntry, PoisonQueue, poison_queue_of
from ._processor import Processor
from ._queue import read_queue_text

__all__ = ["ConsumerStats", "PoisonEntry", "QueueConsumer"]

#: What Azure Functions' queue trigger defaults to: five receives, then poison.
MAX_DEQUEUE_COUNT: Final = 5
#: The longest a queue message may stay hidden, in seconds (seven days).
_MAX_HIDDEN: Final = 7 * 24 * 3600
#: The reasons the processor gives a message it did not try because an
#: earlier one of its key failed in the same call: such a message is tried again.
_HELD: Final = ("an earlier message of key", "not processed: an earlier message")

_log = logging.getLogger(__name__)


class QueueConsumer:
    """Receives a queue's messages and handles them through a :class:`Processor`.

    Each page (up to ``page_size``, at most 32) is received with a
    ``visibility_timeout`` (seconds): the lock. Its messages are grouped by
    key, each key handled on one of ``workers`` threads in one
    :meth:`Processor.process_batch`, then each message is completed,
    abandoned (visible again after ``backoff``, doubling per receive up to
    ``max_backoff``) or poisoned. One key's failure never holds another's
    messages, nor the key's other messages: they are handled again without it.

    Give the queue client no message decode policy (the default): the
    consumer reads base64 envelopes and plain-text ones itself. A message
    without an ``id`` in its envelope takes the queue message's id, which
    recognises redeliveries of that queue message but not a second send.

    :meth:`run` receives until :meth:`stop`; :meth:`stop_on_signals` makes
    SIGTERM and Ctrl-C call it. The processor's publisher must be thread-safe.
    """

    def __init__(
        self,
        processor: Processor[Any],
        queue: QueueClient,
        *,
        poison_queue: QueueClient | None = None,
        visibility_timeout: int = 30,
        max_dequeue_count: int = MAX_DEQUEUE_COUNT,
        page_size: int = 32,
        workers: int = 8,
        backoff: timedelta = timedelta(seconds=1),
        max_backoff: timedelta = timedelta(minutes=1),
        renew_locks: bool = True,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        for name, value, low, high in (
            ("visibility_timeout", visibility_timeout, 1, _MAX_HIDDEN),
            ("max_dequeue_count", max_dequeue_count, 1, None),
            ("page_size", page_size, 1, 32),
            ("workers", workers, 1, None),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
            if high is not None and value > high:
                raise ValueError(f"{name} must be at most {high}, got {value!r}")
        if backoff < timedelta(0) or max_backoff < backoff:
            raise ValueError(f"need 0 <= backoff <= max_backoff, got {backoff} and {max_backoff}")
        self.processor = processor
        self.queue = queue
        self.poison_queue = poison_queue or poison_queue_of(queue)
        self._poisons = PoisonQueue(self.poison_queue)
        self.visibility_timeout = visibility_timeout
        self.max_dequeue_count = max_dequeue_count
        self.page_size = page_size
        self.workers = workers
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.renew_locks = renew_locks
        self.clock = clock
        self.stats = ConsumerStats()
        self._counting = threading.Lock()
        self._stop = threading.Event()
        self._renewal = LockRenewal(queue, visibility_timeout, lambda: self._count(renewed=1))

    # --- running ----------------------------------------------------------------------

    def stop(self) -> None:
        """Stop receiving: the page in hand is finished (messages not yet
        started are released at once), then :meth:`run` returns."""
        self._stop.set()

    def stop_on_signals(self) -> contextlib.AbstractContextManager[None]:
        """While inside, SIGTERM and SIGINT (Ctrl-C) call :meth:`stop`
        (main thread only; elsewhere this does nothing). Restores the
        previous handlers on leaving."""
        return signals_call(self.stop)

    def run(self, *, until_empty: bool = False, idle_wait: float = 1.0) -> ConsumerStats:
        """Receive and handle pages until :meth:`stop`; with ``until_empty``,
        also return once a receive finds the queue empty. ``idle_wait``:
        seconds between receives that find nothing."""
        with (
            self._renewal.running(self.renew_locks),
            ThreadPoolExecutor(self.workers, "queue-key") as pool,
        ):
            while not self._stop.is_set():
                try:
                    got = self._page(pool)
                except AzureError as exc:  # the service is away: what is in hand comes back
                    _log.warning("receive failed, trying again: %s", exc)
                    self._count(receive_errors=1)
                    self._stop.wait(idle_wait)
                    continue
                if got == 0:
                    if until_empty:
                        break
                    self._stop.wait(idle_wait)
        return self.stats

    def run_once(self) -> int:
        """Receive one page and handle it; how many queue messages it held."""
        with (
            self._renewal.running(self.renew_locks),
            ThreadPoolExecutor(self.workers, "queue-key") as pool,
        ):
            return self._page(pool)

    # --- one page -------------------------------------------------------------------

    def _page(self, pool: ThreadPoolExecutor) -> int:
        received = list(
            self.queue.receive_messages(
                messages_per_page=self.page_size,
                max_messages=self.page_size,
                visibility_timeout=self.visibility_timeout,
            )
        )
        if not received:
            return 0
        self._count(received=len(received))
        renew_at = time.monotonic() + self.visibility_timeout / 2
        by_key: dict[str, list[tuple[Held, Message]]] = {}
        for queue_message in received:
            text = text_of(queue_message.content)
            held = Held(queue_message, text if text is not None else "", renew_at)
            self._renewal.hold(held)
            message = self._admit(held, queue_message, text)
            if message is not None:
                by_key.setdefault(message.key, []).append((held, message))
        try:
            futures = [pool.submit(self._key, key, items) for key, items in by_key.items()]
            for future in futures:
                future.result()
        finally:
            for queue_message in received:
                self._renewal.drop(queue_message.id)
        return len(received)

    def _admit(self, held: Held, received: QueueMessage, text: str | None) -> Message | None:
        """The message to handle, or None when it was poisoned or deferred."""
        if text is None:
            self._poison(held, "queue message content is not UTF-8 text")
            return None
        if held.count > self.max_dequeue_count:
            self._poison(
                held,
                f"received {held.count} times, more than max_dequeue_count="
                f"{self.max_dequeue_count}, without being completed",
            )
            return None
        try:
            message = read_queue_text(text, default_id=received.id)
            self.processor.store.partition(message.key)  # a key the table cannot store
        except ValueError as exc:
            self._poison(held, str(exc))
            return None
        if message.due is not None:
            wait = (message.due - self.clock()).total_seconds()
            if wait > 0:  # sent without its delay, or our clock is behind the sender's
                self._release(held, min(_MAX_HIDDEN, math.ceil(wait)))
                self._count(deferred=1)
                return None
        return message

    def _key(self, key: str, items: list[tuple[Held, Message]]) -> None:
        """A key's messages of this page: handled, then each completed,
        abandoned or poisoned; those held back by a failing one, handled again."""
        pending = items
        while pending:
            if self._stop.is_set():  # not started: release for another receiver
                for held, _ in pending:
                    self._release(held, 0)
                return
            try:
                outcomes = self.processor.process_batch(key, [m for _, m in pending])
            except Exception as exc:  # not an outcome: the processor itself failed
                _log.exception("key %r: the processor failed", key)
                for held, _ in pending:
                    self._fault(held, f"{type(exc).__name__}: {exc}")
                return
            again: list[tuple[Held, Message]] = []
            for (held, message), outcome in zip(pending, outcomes, strict=True):
                if outcome.status in ("completed", "duplicate"):
                    self._complete(held, outcome)
                elif outcome.status == "faulted":
                    self._fault(held, outcome.reason or "faulted")
                elif str(outcome.reason).startswith(_HELD[1]):
                    self._fault(held, str(outcome.reason))  # behind one in doubt: later
                elif str(outcome.reason).startswith(_HELD[0]):
                    again.append((held, message))
                else:
                    self._fail(held, outcome)
            if len(again) == len(pending):  # cannot happen; never loop without progress
                for held, _ in again:
                    self._release(held, self._later(held))
                return
            pending = again

    # --- the lifecycle on the queue -------------------------------------------------

    def _complete(self, held: Held, outcome: Outcome) -> None:
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
        if receive.reason is not None:  # faulted
            self._count(faulted=1, lost_locks=int(receive.reason.startswith("lock lost")))
            _log.info("message %r: %s", held.id, receive.reason)
        elif outcome.status == "duplicate":
            self._count(duplicates=1)
        else:
            self._count(completed=1)

    def _fail(self, held: Held, outcome: Outcome) -> None:
        """A handler error: poison after ``max_dequeue_count`` receives, else abandon."""
        reason = outcome.reason or "abandoned"
        if held.count >= self.max_dequeue_count:
            self._poison(
                held, f"failed on receive {held.count} of {self.max_dequeue_count}: {reason}"
            )
            return
        receive = Receive(
            held.id,
            on_abandon=lambda r: self._release(held, self._later(held)),
        )
        receive.abandon(reason)
        self._count(abandoned=1)

    def _fault(self, held: Held, reason: str) -> None:
        """In doubt: the message comes again after a backoff, or when its lock runs out."""
        Receive(held.id).fault(reason)
        self._count(faulted=1)
        self._release(held, self._later(held))

    def _release(self, held: Held, seconds: int) -> None:
        """Make the message visible in ``seconds`` (0: at once), if its lock still holds."""
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
                self._count(lost_locks=1)

    def _poison(self, held: Held, reason: str) -> None:
        """Send the message to the poison queue with ``reason``, then delete it."""
        entry = PoisonEntry(reason, held.text, self.queue.queue_name, held.id, held.count)
        if not self._poisons.send(entry):  # kept: its lock runs out, it comes again
            with held.lock:
                held.done = True
            return
        self._count(poisoned=1)
        with held.lock:
            held.done = True
            try:
                self.queue.delete_message(held.id, held.pop_receipt)
            except AzureError as exc:
                # It comes again and is poisoned again: one more entry for the same text.
                if isinstance(exc, HttpResponseError) and lost_lock(exc):
                    self._count(lost_locks=1)
                else:
                    _log.warning("message %r: poisoned but not deleted: %s", held.id, exc)

    def _later(self, held: Held) -> int:
        return held.backoff(self.backoff, self.max_backoff)

    def _threads(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(self.workers, "queue-key")

    def _count(self, **figures: int) -> None:
        with self._counting:
            for name, value in figures.items():
                setattr(self.stats, name, getattr(self.stats, name) + value)
