"""Queue messages in hand: their pop receipts, their locks, and the renewal
that keeps a lock for work that outlasts it."""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from types import FrameType
from typing import Any
from xml.etree.ElementTree import ParseError

from azure.core.exceptions import (
    AzureError,
    DeserializationError,
    HttpResponseError,
    ResourceNotFoundError,
)
from azure.storage.queue import QueueClient, QueueMessage

from ._breaker import Breaker, is_outage

__all__ = [
    "Held", "LockRenewal", "log_gone", "lost_lock", "message_gone", "queue_fault", "signals_call",
    "text_of",
]  # fmt: skip

_log = logging.getLogger(__name__)


class Held:
    """A queue message in hand: its newest pop receipt, and whether its lock holds."""

    __slots__ = ("count", "done", "id", "kept", "lock", "lost", "pop_receipt", "renew_at", "text")

    def __init__(self, received: QueueMessage, text: str, renew_at: float) -> None:
        self.id: str = received.id
        self.pop_receipt: str = received.pop_receipt or ""
        self.count: int = received.dequeue_count or 1
        self.text = text
        self.renew_at = renew_at
        self.lock = threading.Lock()  # a renewal and the final delete never cross
        self.done = False
        self.lost: str | None = None
        #: Kept in hand while storage is away: its lock is renewed even by a
        #: consumer that renews none for slow work, so the outage costs no receive.
        self.kept = False

    def backoff(self, first: timedelta, most: timedelta) -> int:
        """Seconds to hide it after a failure: ``first``, doubled per receive, to ``most``."""
        seconds = first.total_seconds() * (1 << min(self.count - 1, 30))
        return math.ceil(min(seconds, most.total_seconds()))


def lost_lock(exc: HttpResponseError) -> bool:
    """The service refused the pop receipt: the message is another receive's now.
    A queue deleted meanwhile (404 QueueNotFound) is not: no receive holds its
    messages any more, and the call failed for the queue's sake."""
    if getattr(exc, "error_code", None) == "QueueNotFound":
        return False
    return isinstance(exc, ResourceNotFoundError) or exc.status_code in (400, 404)


def message_gone(exc: BaseException) -> bool:
    """A Delete Message answered 404 MessageNotFound: the message is no longer
    in the queue, so it will not come again. The Queue service answers a
    stale pop receipt of a message still there with 400 PopReceiptMismatch
    (that one is a lost lock: the message comes again); 404 MessageNotFound
    says the message itself is gone: our own delete was applied and its
    answer lost (the SDK retried it), or it expired, or another receive took
    it and deleted it (its processing stored, it was a duplicate there).
    Either way there is nothing left to settle: the message is completed."""
    return (
        isinstance(exc, HttpResponseError)
        and exc.status_code == 404
        # Set by the storage SDK (a str enum), not declared by azure-core.
        and getattr(exc, "error_code", None) == "MessageNotFound"
    )


def log_gone(log: logging.Logger, message_id: str) -> None:
    """The line of a delete that found its message gone (:func:`message_gone`):
    INFO, as for a completed message."""
    log.info("queue message %r: already gone when deleted (MessageNotFound): its delete "
             "applied and its answer lost, or another receive took it; it does not come "
             "again", message_id)  # fmt: skip


def queue_fault(exc: BaseException) -> bool:
    """A failure of the Queue service (no answer, a lost answer, 408, 429,
    5xx, refused credentials...: :func:`is_outage`), not a refused pop receipt.
    An answer cut amid its headers reads as a success with no body, which the
    SDK's XML parser refuses: the request was served and its answer lost."""
    if isinstance(exc, HttpResponseError) and lost_lock(exc):
        return False
    return is_outage(exc) or isinstance(exc, ParseError | DeserializationError)


def text_of(content: Any) -> str | None:
    """A queue message's text (None: bytes that are not UTF-8)."""
    if isinstance(content, str):
        return content
    if isinstance(content, bytes | bytearray):
        try:
            return bytes(content).decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None if content is None else str(content)


class LockRenewal:
    """Extends the lock of each message in hand once half of it has run out
    (with ``all_locks`` false, only of those kept while a service is away).
    A renewal the Queue service fails is tried again on the next tick, and
    opens ``breaker`` (its one line); an answer does not close it: the
    service may throttle deletes while it renews."""

    def __init__(
        self,
        queue: QueueClient,
        visibility_timeout: int,
        on_renewed: Callable[[], None],
        breaker: Breaker,
    ) -> None:
        self.queue = queue
        self.breaker = breaker
        self.visibility_timeout = visibility_timeout
        self.on_renewed = on_renewed
        self.all_locks = True
        self._in_hand: dict[str, Held] = {}
        self._lock = threading.Lock()

    def hold(self, held: Held) -> None:
        with self._lock:
            self._in_hand[held.id] = held

    def drop(self, message_id: str) -> None:
        with self._lock:
            self._in_hand.pop(message_id, None)

    @contextlib.contextmanager
    def running(self, all_locks: bool = True) -> Iterator[None]:
        """Renewing while inside: every lock, or with ``all_locks`` false only
        those of messages kept while storage is away."""
        self.all_locks = all_locks
        done = threading.Event()
        renewer = threading.Thread(target=self._loop, args=(done,), daemon=True)
        renewer.start()
        try:
            yield
        finally:
            done.set()
            renewer.join()

    def _loop(self, done: threading.Event) -> None:
        tick = min(1.0, self.visibility_timeout / 6)
        while not done.wait(tick):
            now = time.monotonic()
            with self._lock:
                due = [
                    h
                    for h in self._in_hand.values()
                    if h.renew_at <= now and (self.all_locks or h.kept)
                ]
            for held in due:
                self._renew(held)

    def _renew(self, held: Held) -> None:
        with held.lock:
            if held.done or held.lost is not None:
                return
            try:
                updated: Any = self.queue.update_message(
                    held.id, held.pop_receipt, visibility_timeout=self.visibility_timeout
                )
            except AzureError as exc:
                if isinstance(exc, HttpResponseError) and lost_lock(exc):
                    held.lost = f"lock lost before a renewal: {exc.message}"
                elif queue_fault(exc):  # tried again on the next tick
                    self.breaker.failed(f"renewal of queue message {held.id!r}: {exc}")
                else:
                    _log.warning("message %r: renewal failed: %s", held.id, exc)
                return
            held.pop_receipt = updated.pop_receipt or held.pop_receipt
            held.renew_at = time.monotonic() + self.visibility_timeout / 2
        self.on_renewed()


@contextlib.contextmanager
def signals_call(stop: Callable[[], None]) -> Iterator[None]:
    """While inside, SIGTERM and SIGINT call ``stop`` (on the main thread;
    elsewhere nothing changes). The previous handlers come back on leaving."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum: int, frame: FrameType | None) -> None:
        _log.info("signal %d: stopping after the messages in hand", signum)
        stop()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
