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

import re
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.storage.queue import QueueClient

from .._messages._envelope import read_queue_text
from .._messages._message import Message
from ._poison import PoisonEntry

__all__ = ["PoisonFilter", "PoisonSummary", "ShelvedEntry", "read_poison", "reason_group"]

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


def reason_group(reason: str) -> str:
    """The reason without what differs between messages failing the same way
    (the receive counts, the message's id), as ServicePulse groups failures by
    exception type and message."""
    reason = re.sub(r"on receive \d+ of \d+", "on receive N of M", reason)
    return re.sub(r"(on|of) message '(?:[^'\\]|\\.)*'", r"\1 message '...'", reason)


@dataclass(frozen=True, slots=True)
class PoisonFilter:
    """Which entries an operation takes: each field given narrows it (an
    empty filter takes every decoded entry). ``reasons`` are groups
    (:func:`reason_group`), ``ids`` the poison queue's message ids or the
    original messages' ids."""

    reasons: frozenset[str] = frozenset()
    keys: frozenset[str] = frozenset()
    types: frozenset[str] = frozenset()
    ids: frozenset[str] = frozenset()
    older_than: timedelta | None = None

    def matches(self, shelved: ShelvedEntry, now: datetime) -> bool:
        entry, message = shelved.entry, shelved.message
        if entry is None:
            return False
        if self.reasons and reason_group(entry.reason) not in self.reasons:
            return False
        if self.keys and (message is None or message.key not in self.keys):
            return False
        if self.types and (message is None or message.type not in self.types):
            return False
        if self.ids and not {shelved.id, message and message.id} & self.ids:
            return False
        return self.older_than is None or now - shelved.poisoned_at >= self.older_than


#: The age buckets of a summary, their upper bounds.
AGES = (
    ("< 1 hour", timedelta(hours=1)),
    ("< 1 day", timedelta(days=1)),
    ("< 1 week", timedelta(weeks=1)),
    (">= 1 week", timedelta.max),
)


@dataclass(frozen=True, slots=True)
class PoisonSummary:
    """A poison queue's entries counted: by reason group, by key, by age."""

    total: int
    by_reason: dict[str, int] = field(default_factory=dict)
    by_key: dict[str, int] = field(default_factory=dict)
    by_age: dict[str, int] = field(default_factory=dict)
    oldest: ShelvedEntry | None = None
    newest: ShelvedEntry | None = None
    undecodable: tuple[ShelvedEntry, ...] = ()

    @classmethod
    def of(cls, entries: list[ShelvedEntry], now: datetime | None = None) -> PoisonSummary:
        now = now or datetime.now(UTC)
        reasons: Counter[str] = Counter()
        keys: Counter[str] = Counter()
        ages: Counter[str] = Counter()
        for shelved in entries:
            if shelved.entry is not None:
                reasons[reason_group(shelved.entry.reason)] += 1
            if shelved.message is not None:
                keys[shelved.message.key] += 1
            age = now - shelved.poisoned_at
            ages[next(name for name, bound in AGES if age < bound)] += 1
        by_time = sorted(entries, key=lambda e: e.poisoned_at)
        return cls(
            len(entries),
            dict(reasons.most_common()),
            dict(keys.most_common()),
            {name: ages[name] for name, _ in AGES if ages[name]},
            by_time[0] if by_time else None,
            by_time[-1] if by_time else None,
            tuple(e for e in entries if e.error is not None),
        )


def _shelved(received: Any) -> ShelvedEntry:
    text: str = received.content
    entry = message = error = None
    try:
        entry = PoisonEntry.decode(text)
    except ValueError as exc:
        error = str(exc)
    if entry is not None:
        if entry.content_length is not None:
            error = (
                f"the original text was cut to {len(entry.content)} of "
                f"{entry.content_length} characters"
            )
        else:
            try:  # an envelope without id took its queue message's: it keeps it
                message = read_queue_text(entry.content, default_id=entry.queue_message_id)
            except ValueError as exc:
                error = str(exc)
    return ShelvedEntry(received.id, received.inserted_on, text, entry, message, error)


@contextmanager
def held(poison: QueueClient, hold: timedelta) -> Iterator[list[tuple[Any, ShelvedEntry]]]:
    """Every entry of ``poison`` received and held for ``hold``, with its queue
    message (to delete it); on leaving, those still held are made visible
    again (the caller removes from the list those it deleted)."""
    seconds = max(1, int(hold.total_seconds()))
    taken: list[tuple[Any, ShelvedEntry]] = []
    seen: set[str] = set()
    try:
        while page := list(
            poison.receive_messages(
                messages_per_page=_PAGE, max_messages=_PAGE, visibility_timeout=seconds
            )
        ):
            for received in page:
                if received.id not in seen:  # hold too short: it came again
                    seen.add(received.id)
                    taken.append((received, _shelved(received)))
        yield taken
    finally:
        for received, _ in taken:
            # One received again after ``hold`` has a newer receipt: it shows by itself.
            with suppress(ResourceNotFoundError, HttpResponseError):
                poison.update_message(received, visibility_timeout=0)


def read_poison(
    poison: QueueClient, *, hold: timedelta = timedelta(minutes=1)
) -> list[ShelvedEntry]:
    """Every entry of a poison queue, oldest first, left in the queue."""
    with held(poison, hold) as taken:
        return sorted((s for _, s in taken), key=lambda s: s.poisoned_at)
