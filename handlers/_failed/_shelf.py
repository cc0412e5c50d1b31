"""Reading a poison queue without emptying it: every entry, decoded or reported.

A queue's peek shows at most its first 32 messages and cannot page, so a
deep poison queue is read by receiving: each page is received hidden for
``hold`` (long enough for the whole reading, so no entry comes twice), and
every entry is made visible again at the end. A reader that crashes leaves
the entries hidden until ``hold`` runs out, never removed: nothing consumes a
poison queue, so the only cost is a short wait and one more dequeue count on
the poison queue's own message (not the entry's ``dequeue_count``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from xml.etree.ElementTree import ParseError

from azure.core.exceptions import AzureError, ResourceNotFoundError
from azure.storage.queue import QueueClient

from .._messages._envelope import read_queue_text
from .._messages._message import Message
from .._queues._account import check_queue_name
from .._queues._poison import PoisonEntry

__all__ = [
    "PoisonDepth", "ShelvedEntry", "find_poison", "held", "not_seen", "poison_depth", "read_poison",
]  # fmt: skip

_log = logging.getLogger(__name__)

#: A page as the service gives it at most.
_PAGE = 32


@dataclass(frozen=True, slots=True)
class ShelvedEntry:
    """One poison queue message: its entry and the message it holds, or why
    either cannot be read (such an entry is reported, never removed)."""

    #: The poison queue's own message id (not the original message's).
    id: str
    #: When the poison queue took it: when the message was poisoned.
    poisoned_at: datetime
    text: str
    entry: PoisonEntry | None
    #: The original message, when the entry's whole text reads as an envelope.
    message: Message | None
    #: Why the entry, or the message it holds, cannot be read; ``None``: both read.
    error: str | None


def _shelved(received: Any) -> ShelvedEntry:
    text = received.content if isinstance(received.content, str) else repr(received.content)
    entry = message = error = None
    try:
        entry = PoisonEntry.decode(text)
        check_queue_name(entry.queue, "the queue it came from,")
    except Exception as exc:  # any text may sit on a queue: it is reported and kept
        entry, error = None, str(exc)
    if entry is not None:
        if entry.content_length is not None:
            error = (
                f"the original text was cut to {len(entry.content)} of "
                f"{entry.content_length} characters"
            )
        else:
            try:  # an envelope without id took its queue message's: it keeps it
                message = read_queue_text(entry.content, default_id=entry.queue_message_id)
            except Exception as exc:  # as above
                error = str(exc)
    return ShelvedEntry(received.id, received.inserted_on, text, entry, message, error)


@contextmanager
def held(poison: QueueClient, hold: timedelta) -> Iterator[list[tuple[Any, ShelvedEntry]]]:
    """Every entry of ``poison`` received and held for ``hold``, with its queue
    message (to delete it); on leaving, those still held are made visible
    again (the caller removes from the list those it deleted). A poison
    queue that does not exist holds nothing. The reading ends when the hold
    runs out, complete or not (logged): past it, the first entries show
    again and would be received over and over."""
    seconds = max(1, int(hold.total_seconds()))
    ends = time.monotonic() + seconds
    taken: list[tuple[Any, ShelvedEntry]] = []
    #: Each entry's id, and when its hold runs out (it shows again by itself).
    shows: dict[str, float] = {}
    try:
        while page := _page(poison, seconds):
            asked = time.monotonic()
            new = [received for received in page if received.id not in shows]
            for received in new:
                shows[received.id] = asked + seconds
                taken.append((received, _shelved(received)))
            if not new or time.monotonic() >= ends:
                _log.warning("read %d entries of %s before the hold of %d s ran out: those "
                             "not read show again after it (give a longer hold)", len(taken),
                             poison.queue_name, seconds)  # fmt: skip
                break
        yield taken
    finally:
        for received, _ in taken:
            if time.monotonic() < shows[received.id]:  # else it shows already
                with suppress(AzureError, ParseError):  # its hold ran out meanwhile
                    poison.update_message(received, visibility_timeout=0)


def _page(poison: QueueClient, seconds: int) -> list[Any]:
    try:
        return list(poison.receive_messages(
            messages_per_page=_PAGE, max_messages=_PAGE, visibility_timeout=seconds
        ))  # fmt: skip
    except ResourceNotFoundError:
        return []


def read_poison(
    poison: QueueClient, *, hold: timedelta = timedelta(minutes=1)
) -> list[ShelvedEntry]:
    """Every entry of a poison queue, oldest first, left in the queue. While
    it reads, the entries are hidden from other readers, for at most ``hold``."""
    with held(poison, hold) as taken:
        return sorted((s for _, s in taken), key=lambda s: s.poisoned_at)


def find_poison(
    poison: QueueClient, id: str, *, hold: timedelta = timedelta(minutes=1)
) -> list[ShelvedEntry]:
    """The entries whose poison queue message id, or original message id, is
    ``id`` (one message poisoned twice has two entries)."""
    return [s for s in read_poison(poison, hold=hold)
            if id in (s.id, s.message and s.message.id)]  # fmt: skip


@dataclass(frozen=True, slots=True)
class PoisonDepth:
    """What to alert on: how many entries a poison queue holds (as the
    service counts them, entries a reader holds included), how long the
    oldest one it shows has waited (``None``: it shows none), and how many
    it does not show because a reader holds them (``None``: more than a
    peek can tell; while some are held, the oldest may be among them)."""

    queue: str
    depth: int
    oldest_age: timedelta | None
    hidden: int | None = 0


def poison_depth(poison: QueueClient, *, now: datetime | None = None) -> PoisonDepth:
    """Two cheap calls, nothing received: the queue's approximate message
    count, and a peek at its front (the service keeps no strict order, so the
    oldest of the 32 it shows). A queue not made yet holds nothing."""
    try:
        depth = poison.get_queue_properties().approximate_message_count or 0
        shown = poison.peek_messages(max_messages=_PAGE)
    except ResourceNotFoundError:
        return PoisonDepth(poison.queue_name, 0, None)
    first = min((m.inserted_on for m in shown if m.inserted_on), default=None)
    age = None if first is None else max(timedelta(0), (now or datetime.now(UTC)) - first)
    hidden = max(0, depth - len(shown)) if len(shown) < _PAGE else None
    return PoisonDepth(poison.queue_name, depth, age, hidden)


def not_seen(poison: QueueClient, seen: int) -> int:
    """How many entries the queue counts beyond the ``seen`` ones a reading
    took: held by another reader (or a stopped one) until its hold runs out."""
    try:
        return max(0, (poison.get_queue_properties().approximate_message_count or 0) - seen)
    except ResourceNotFoundError:
        return 0
