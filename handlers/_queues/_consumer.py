"""A queue consumer: Azure Storage Queue messages through the receive lifecycle.

A queue message is received with a visibility timeout: it stays on the queue,
hidden from other receivers, until the timeout runs out. That is a peek-lock
receive, and each one is a :class:`Receive`:

- **complete**: the message was processed, or recognised as a duplicate, its
  outputs published; it is deleted with its pop receipt;
- **abandon**: the handler failed on it; it is made visible again after a
  backoff, to be received again (and poisoned on its last allowed receive);
- **fault**: the lock was lost (another receiver may have it: the message
  comes back, is recognised as a duplicate, its outputs published again), or
  storage or the Queue service is away: then the message stays in hand, its
  lock renewed, and is tried again once it answers (a circuit breaker pauses
  receiving).

A text enters through the admission (``_admission``): one that cannot become
a message, or a message that can never be handled (an unknown type, a key
the table cannot store...), is poisoned at once, alone, with its reason
(``_settling`` does what the queue needs; ``_rounds`` retries a key).
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
from typing import Any, Final, Literal

from azure.core.exceptions import AzureError
from azure.storage.queue import QueueClient, QueueMessage

from .._cache import HeaderCache
from .._messages._admission import Refused, SentAt, admit_text
from .._messages._message import Message
from .._outcome import utcnow
from .._processor import Processor
from . import _spans
from ._breaker import Breaker
from ._locks import Held, LockRenewal, signals_call, text_of
from ._poison import PoisonEntry, poison_queue_of
from ._publisher import poison_name_refusal
from ._rounds import process_until_settled, received_too_often
from ._settling import ConsumerStats, QueueOutcome, Settler

__all__ = ["ConsumerStats", "PoisonEntry", "QueueConsumer", "QueueOutcome"]

#: What Azure Functions' queue trigger defaults to: five receives, then poison.
MAX_DEQUEUE_COUNT: Final = 5
#: The longest a queue message may stay hidden, in seconds (seven days).
_MAX_HIDDEN: Final = 7 * 24 * 3600

_log = logging.getLogger(__name__)

#: The time of a queue message the late-duplicate check takes as its sent time.
SentAtSource = Literal["produced", "inserted_on"]


class QueueConsumer:
    """Receives a queue's messages and handles them through a :class:`Processor`.

    Each page (up to ``page_size``, at most 32) is received with a
    ``visibility_timeout`` (seconds): the lock. Its messages are grouped by
    key, each key handled on one of ``workers`` threads, then each message is
    completed, abandoned (visible again after ``backoff``, doubling per
    receive up to ``max_backoff``) or poisoned. One key's failure never holds
    another's messages, nor the key's other messages: they are handled again
    at once without it. A message that can never be handled (it is not a
    message, its type is unknown, the table cannot store its key or id...)
    is poisoned at once.

    When storage is away, no message is given up: the page in hand is kept
    (locks renewed) and tried again after ``pause``, doubled per failed try
    up to ``max_pause``, and nothing more is received until storage answers.
    The Queue service's faults (no answer, 408, 429, 5xx) are outages too,
    on a second breaker: a delete or poison entry is tried again the same
    way, its message in hand. ``renew_locks=False`` renews no lock for slow
    work (a kept message's lock still is: an outage must cost no receive).

    A message received more than ``max_dequeue_count`` times is handled as
    a duplicate if it is stored, else poisoned unprocessed. One poisoned
    whose delete failed is only deleted when it comes again (the last
    10,000 ids, in memory: after a restart it may be poisoned again).

    ``sent_at``: which time of a message the late-duplicate check takes as
    its sent time: ``"produced"`` (the envelope's, set when the producing
    handler first processed its source: the same on every copy) or
    ``"inserted_on"`` (when the queue took this copy); a message without it
    is poisoned. ``on_outcome(QueueOutcome)`` hears of every received message.

    Give the queue client no message decode policy (the default): the
    consumer reads base64 envelopes and plain-text ones itself. A message
    without an ``id`` in its envelope takes the queue message's id, which
    recognises redeliveries of that queue message but not a second send.
    ``<queue>-poison`` must be a valid queue name (the queue's at most 56
    characters) unless ``poison_queue`` is given.

    A processor without a header cache is given one (a :class:`HeaderCache`
    with its default bounds, the processor's own from then on, shared with
    whatever else uses that processor): a new key costs one table request,
    not two. Pass ``Processor(..., cache=...)`` to size or share your own.

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
        pause: timedelta = timedelta(seconds=1),
        max_pause: timedelta = timedelta(minutes=1),
        renew_locks: bool = True,
        sent_at: SentAtSource | None = None,
        on_outcome: Callable[[QueueOutcome], None] | None = None,
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
        if sent_at not in (None, "produced", "inserted_on"):
            raise ValueError(f"sent_at must be 'produced', 'inserted_on' or None, got {sent_at!r}")
        too_long = poison_name_refusal(queue.queue_name) if poison_queue is None else None
        if too_long is not None:
            raise ValueError(too_long)
        if processor.cache is None:  # see the docstring: the processor owns it from now on
            processor.cache = HeaderCache()
        self.processor = processor
        self.queue = queue
        self.poison_queue = poison_queue or poison_queue_of(queue)
        self.visibility_timeout = visibility_timeout
        self.max_dequeue_count = max_dequeue_count
        self.page_size = page_size
        self.workers = workers
        self.renew_locks = renew_locks
        self.sent_at = sent_at
        self.clock = clock
        self._stop = threading.Event()
        self._storage = Breaker("storage", "pausing receives", pause, max_pause, _log,
                                on_open=lambda: self._count(outages=1))  # fmt: skip
        # The Queue service's: receives, deletes, renewals, releases, poison entries.
        self._queueing = Breaker(f"queue {queue.queue_name!r}", "receiving paused", pause,
                                 max_pause, _log,
                                 on_open=lambda: self._count(outages=1))  # fmt: skip
        self._settle = Settler(queue, self.poison_queue, max_dequeue_count,
                               (backoff, max_backoff), on_outcome, self._queueing,
                               self._stop, processor.handler.name,
                               processor.trace_context)  # fmt: skip
        self._renewal = LockRenewal(queue, visibility_timeout, lambda: self._count(renewed=1),
                                    self._queueing)  # fmt: skip

    @property
    def stats(self) -> ConsumerStats:
        """What this consumer did since it was made (each :meth:`run` returns its own)."""
        return self._settle.stats

    # --- running ----------------------------------------------------------------------

    def stop(self) -> None:
        """Stop receiving: the page in hand is finished (messages not yet
        started, or waiting for storage, are released at once; a delete
        waiting for the Queue service is given up: it comes again, a
        duplicate), then :meth:`run` returns."""
        self._stop.set()

    def stop_on_signals(self) -> contextlib.AbstractContextManager[None]:
        """While inside, SIGTERM and SIGINT (Ctrl-C) call :meth:`stop`
        (main thread only; elsewhere this does nothing). Restores the
        previous handlers on leaving."""
        return signals_call(self.stop)

    def run(self, *, until_empty: bool = False, idle_wait: float = 1.0) -> ConsumerStats:
        """Receive and handle pages until :meth:`stop`; with ``until_empty``,
        also return once a receive finds the queue empty. ``idle_wait``:
        seconds between receives that find nothing. Returns the figures of
        this run (``stats`` adds up every run)."""
        figures = self._settle.new_run()
        with self._renewal.running(self.renew_locks), self._threads() as pool:
            while not self._stop.is_set():
                started = self._queueing.stamp()
                try:
                    got = self._page(pool)
                except Exception as exc:  # the service is away: what is in hand comes back
                    if not isinstance(exc, AzureError):
                        _log.exception("a page failed")
                    self._count(receive_errors=1)
                    # A bug after the receive answered pauses too (``started``: not older).
                    since = started if isinstance(exc, AzureError) else None
                    self._stop.wait(self._queueing.failed(f"receive: {exc}", since))
                    continue
                if got == 0:
                    if until_empty:
                        break
                    self._stop.wait(idle_wait)
        return figures

    def run_once(self) -> int:
        """Receive one page and handle it; how many queue messages it held."""
        with self._renewal.running(self.renew_locks), self._threads() as pool:
            return self._page(pool)

    # --- one page -------------------------------------------------------------------

    def _page(self, pool: ThreadPoolExecutor) -> int:
        started = time.time_ns()  # each admitted message's receive span starts here
        received = list(
            self.queue.receive_messages(
                messages_per_page=self.page_size,
                max_messages=self.page_size,
                visibility_timeout=self.visibility_timeout,
            )
        )
        self._queueing.succeeded()
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
                message = _spans.received(self.queue.queue_name, held, message, started,
                                          self.processor.trace_context)  # fmt: skip
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
        """The message to handle, or None when it was poisoned or deferred. One
        received too often is handled only if it is stored (see ``_key``)."""
        if self._settle.poisoned_before(held):
            return None
        if text is None:
            self._settle.poison(held, None, "queue message content is not UTF-8 text")
            return None
        admitted = admit_text(
            text, default_id=received.id, accepts=self.processor.handler.accepts,
            handler=self.processor.store.handler_name,
            sent_at=None if self.sent_at is None else lambda m: self._sent_time(m, received),
        )  # fmt: skip
        if isinstance(admitted, Refused):
            self._settle.poison(held, admitted.message, admitted.reason)
            return None
        if admitted.due is not None:
            wait = (admitted.due - self.clock()).total_seconds()
            if wait > 0:  # sent without its delay, or our clock is behind the sender's
                self._settle.release(held, min(_MAX_HIDDEN, math.ceil(wait)))
                self._count(deferred=1)
                self._settle.report("deferred", held, admitted, f"due {admitted.due.isoformat()}")
                return None
        return admitted

    def _sent_time(self, message: Message, received: QueueMessage) -> SentAt:
        if self.sent_at == "produced":
            return "field 'produced'", message.produced
        return "the queue's insertion time", received.inserted_on

    def _key(self, key: str, items: list[tuple[Held, Message]]) -> None:
        """A key's messages of this page, each completed, abandoned or poisoned
        once settled (see ``_rounds``); released at once when stopping."""
        settle = self._settle
        items = received_too_often(
            items, self.max_dequeue_count, settle, lambda m: self._stored(key, m), self._stop.is_set
        )
        done: set[int] = set()

        def kept(index: int, outcome: Any) -> None:
            settle.fault(items[index][0], items[index][1], outcome)

        try:
            for index, outcome in process_until_settled(
                self.processor, key, [m for _, m in items], breaker=self._storage,
                stopping=self._stop.is_set, pause=self._stop.wait, on_fault=kept,
            ):  # fmt: skip
                done.add(index)
                held, message = items[index]
                if outcome is None or outcome.kind in ("stopped", "held"):
                    settle.release(held, 0, message, "stopping" if outcome is None else
                                   outcome.reason)  # fmt: skip
                elif outcome.kind in ("completed", "duplicate", "consumed"):
                    settle.complete(held, outcome)
                elif outcome.kind == "refused":
                    settle.poison(held, message, outcome.reason or "refused", outcome)
                else:  # failed, or faulted by what is not an outage
                    settle.fail(held, outcome)
        except Exception as exc:  # not an outcome: a bug; the rest comes again
            _log.exception("key %r: the processor failed", key)
            for index, (held, message) in enumerate(items):
                if index not in done:
                    why = f"{type(exc).__name__}: {exc}"
                    settle.release(held, settle.later(held), message, why)

    def _stored(self, key: str, message: Message) -> bool:
        store = self.processor.store
        return self._storage.call(
            lambda: store.find(store.partition(key), message.id) is not None,
            f"looking up message {message.id!r}", stopping=self._stop.is_set,
            pause=self._stop.wait,
        )  # fmt: skip

    def _threads(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(self.workers, "queue-key")

    def _count(self, **figures: int) -> None:
        self._settle.count(**figures)
