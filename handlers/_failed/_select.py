"""Which poison entries an operation takes, and a poison queue's entries counted."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from ._shelf import ShelvedEntry

__all__ = ["AGES", "PoisonFilter", "PoisonSummary", "reason_group"]


#: A handler's failure as HandlerFailedError words it, where in its code known.
_HANDLER_FAILED = re.compile(
    r"handler (?P<handler>'(?:[^'\\]|\\.)*') failed on message '\.\.\.': "
    r"(?P<type>[\w.]+): .*? \(at (?P<where>[^()]*)\)$",
    re.S,
)


def reason_group(reason: str) -> str:
    """The reason without what differs between messages failing the same way,
    as ServicePulse groups failures by exception type and place: the receive
    counts and the message's id go, and a handler's failure is its handler,
    its exception's type and the line of the handler's code that raised (the
    exception's own words, which often hold the message's values, go too)."""
    reason = re.sub(r"on receive \d+ of \d+", "on receive N of M", reason)
    reason = re.sub(r"(on|of) message '(?:[^'\\]|\\.)*'", r"\1 message '...'", reason)
    return _HANDLER_FAILED.sub(r"handler \g<handler> failed: \g<type> (at \g<where>)", reason)


@dataclass(frozen=True, slots=True)
class PoisonFilter:
    """Which entries an operation takes: each field given narrows it (an
    empty filter takes every entry that reads). ``reasons`` are groups
    (:func:`reason_group`), ``ids`` the poison queue's message ids or the
    original messages' ids, ``older_than`` the time since an entry was
    poisoned. An entry that does not read is taken only by its poison queue
    message id, given alone in ``ids``: a purge of that one entry."""

    reasons: frozenset[str] = frozenset()
    keys: frozenset[str] = frozenset()
    types: frozenset[str] = frozenset()
    ids: frozenset[str] = frozenset()
    older_than: timedelta | None = None

    def matches(self, shelved: ShelvedEntry, now: datetime) -> bool:
        entry, message = shelved.entry, shelved.message
        if self.older_than is not None and now - shelved.poisoned_at < self.older_than:
            return False
        if message is None:
            # Only what it is named by: what it holds cannot be told.
            return shelved.id in self.ids and not (self.reasons or self.keys or self.types)
        if self.reasons and (entry is None or reason_group(entry.reason) not in self.reasons):
            return False
        if self.keys and message.key not in self.keys:
            return False
        if self.types and message.type not in self.types:
            return False
        return not self.ids or bool({shelved.id, message.id} & self.ids)


#: The age buckets of a summary, their upper bounds.
AGES = (
    ("< 1 hour", timedelta(hours=1)),
    ("< 1 day", timedelta(days=1)),
    ("< 1 week", timedelta(weeks=1)),
    (">= 1 week", timedelta.max),
)


@dataclass(frozen=True, slots=True)
class PoisonSummary:
    """A poison queue's entries counted: by reason group, by key, by age;
    the oldest and newest, and those that do not read."""

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
            tuple(e for e in entries if e.message is None),
        )
