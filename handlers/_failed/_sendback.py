"""Sending poisoned messages back to their queue once their cause is fixed,
and purging entries no one will send back.

Each entry is sent first, then deleted: a crash between the two leaves a
copy on both sides, never none, and the copy that arrives twice is a
duplicate the runtime recognises, since the message keeps its id. The text
sent is the original one, so its id and ``due`` travel as they were (an
envelope that had no id gets its first queue message's id written in,
which the consumer had given it). A scheduled message not yet due is sent
hidden until then.
"""

from __future__ import annotations

import base64
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.storage.queue import QueueClient

from .._messages._envelope import encode_envelope, read_queue_text
from .._queues._account import queue_beside
from .._queues._poison import NEVER
from .._queues._publisher import POISON_SUFFIX
from ._select import PoisonFilter
from ._shelf import ShelvedEntry, held, not_seen

__all__ = ["PurgeReport", "SendBackReport", "purge_poison", "send_back"]

_log = logging.getLogger(__name__)

#: The longest a queue message may be hidden: a message due later is sent
#: hidden this long, and a consumer hides it again until its due time.
_MAX_HIDDEN = 7 * 24 * 3600


@dataclass(frozen=True, slots=True)
class SendBackReport:
    """What a send-back did (or, in a dry run, would do): the entries sent,
    each with the queue it went to; those left (not matching, or not
    readable); and those sent whose entry could not be deleted (their hold
    ran out: a later send-back sends them again, a duplicate)."""

    sent: tuple[tuple[ShelvedEntry, str], ...]
    left: tuple[ShelvedEntry, ...]
    dry_run: bool
    not_deleted: tuple[ShelvedEntry, ...] = ()
    #: Entries of a message another entry sent (entries are at least once):
    #: deleted, not sent again.
    copies: tuple[ShelvedEntry, ...] = ()
    #: Entries the queue counted that this send-back did not see: another
    #: reader (or a stopped send-back) holds them; they show again after its hold.
    not_seen: int = 0


@dataclass(frozen=True, slots=True)
class PurgeReport:
    """The entries a purge deleted (none when it was not confirmed) and those it left."""

    purged: tuple[ShelvedEntry, ...]
    left: tuple[ShelvedEntry, ...]
    #: As :attr:`SendBackReport.not_seen`.
    not_seen: int = 0


def _text(shelved: ShelvedEntry) -> str:
    assert shelved.entry is not None
    assert shelved.message is not None
    try:
        read_queue_text(shelved.entry.content)
    except ValueError:  # no id of its own: the one the consumer gave it, written in
        return base64.b64encode(encode_envelope(shelved.message).encode()).decode()
    return shelved.entry.content


def _delete(poison: QueueClient, received: Any) -> bool:
    """False when the entry's hold ran out and another reader holds it now."""
    try:
        poison.delete_message(received)
    except ResourceNotFoundError:  # gone already: a lost answer tried again
        return True
    except HttpResponseError as exc:
        if exc.status_code != 400:
            raise
        return False
    return True


def _targets(
    poison: QueueClient, chosen: Sequence[ShelvedEntry], to: QueueClient | None
) -> dict[str, QueueClient]:
    """The queue of each chosen entry, each checked to exist before anything
    is sent: a queue named wrong is refused, not made."""
    names = {s.entry.queue for s in chosen if s.entry is not None}
    targets = {n: to or queue_beside(poison, n) for n in sorted(names)}
    missing = []
    for target in {t.queue_name: t for t in targets.values()}.values():
        try:
            target.get_queue_properties()
        except ResourceNotFoundError:
            missing.append(target.queue_name)
    if missing:
        raise ValueError(
            f"no queue {', '.join(map(repr, missing))} in the account: nothing was sent "
            "(make it, or send to another queue)"
        )
    return targets


def send_back(
    poison: QueueClient,
    where: PoisonFilter | None = None,
    *,
    to: QueueClient | None = None,
    dry_run: bool = False,
    hold: timedelta = timedelta(minutes=5),
    on_sent: Callable[[ShelvedEntry, str], None] | None = None,
) -> SendBackReport:
    """Send the matching entries of ``poison`` back to the queue each came
    from (or ``to``), then delete each; ``dry_run`` sends and deletes
    nothing. Entries that cannot be read are left, and logged. ``hold``
    should outlast the whole send-back: an entry still to send when it runs
    out may be taken by another reader, and one sent then is not deleted
    (reported: sent again later, a duplicate). Copies of one message (entries
    are at least once) are sent once and all deleted. ``on_sent(entry,
    queue)`` hears of each as it is sent. A fault of the Queue service stops
    it with the error: what was sent is deleted or stays as a copy, so
    running it again is safe. ``to`` may not be a poison queue."""
    if to is not None and to.queue_name.endswith(POISON_SUFFIX):
        raise ValueError(
            f"cannot send back to {to.queue_name!r}: a poison queue holds entries, not "
            "messages (what went there could not be sent back again)"
        )
    now, where = datetime.now(UTC), where or PoisonFilter()
    sent: list[tuple[ShelvedEntry, str]] = []
    left: list[ShelvedEntry] = []
    not_deleted: list[ShelvedEntry] = []
    copies: list[ShelvedEntry] = []
    with held(poison, hold) as taken:
        unseen = not_seen(poison, len(taken))  # counted before any delete
        chosen = []
        for received, shelved in taken:
            if shelved.error is not None:
                _log.warning("poison entry %s left in %s: %s", shelved.id, poison.queue_name,
                             shelved.error)  # fmt: skip
            if shelved.message is None or not where.matches(shelved, now):
                left.append(shelved)
            else:
                chosen.append((received, shelved))
        targets = _targets(poison, [s for _, s in chosen], to)
        # A message is its key and id (the runtime's duplicate check is per key).
        done: set[tuple[str, str, str]] = set()
        for received, shelved in chosen:
            assert shelved.entry is not None
            assert shelved.message is not None
            target = targets[shelved.entry.queue]
            one = (target.queue_name, shelved.message.key, shelved.message.id)
            if one in done:
                copies.append(shelved)
            else:
                done.add(one)
                sent.append((shelved, target.queue_name))
                if not dry_run:
                    _send(target, shelved, now)
                if on_sent is not None:  # as it goes: a send-back that fails later says what went
                    on_sent(shelved, target.queue_name)
                    _log.info("poisoned message %r of key %r sent back to %s",
                              shelved.message.id, shelved.message.key,
                              target.queue_name)  # fmt: skip
            if dry_run:
                continue
            if _delete(poison, received):  # only once it is sent
                taken.remove((received, shelved))
            else:
                not_deleted.append(shelved)
                _log.warning("poison entry %s of message %r sent back but not deleted (its hold "
                             "ran out): a later send-back sends it again, a duplicate",
                             shelved.id, shelved.message.id)  # fmt: skip
    return SendBackReport(tuple(sent), tuple(left), dry_run, tuple(not_deleted), tuple(copies),
                          unseen)  # fmt: skip


def _send(target: QueueClient, shelved: ShelvedEntry, now: datetime) -> None:
    """The original text, hidden until due (at most a week: a consumer hides
    it again until then), never expiring: it waited once already."""
    assert shelved.message is not None
    due = shelved.message.due
    delay = 0 if due is None else max(0, math.ceil((due - now).total_seconds()))
    target.send_message(_text(shelved), visibility_timeout=min(delay, _MAX_HIDDEN) or None,
                        time_to_live=NEVER)  # fmt: skip


def purge_poison(
    poison: QueueClient,
    where: PoisonFilter | None = None,
    *,
    confirm: Callable[[list[ShelvedEntry]], bool] | None = None,
    hold: timedelta = timedelta(minutes=5),
) -> PurgeReport:
    """Delete the matching entries of ``poison`` for good. ``confirm`` is
    shown exactly the entries that would go, and nothing is deleted unless
    it answers True; the entries stay held meanwhile, so what it saw is what
    goes. An entry that does not read is purged only when named alone by its
    id (see :class:`PoisonFilter`)."""
    now, where = datetime.now(UTC), where or PoisonFilter()
    with held(poison, hold) as taken:
        unseen = not_seen(poison, len(taken))
        chosen = [(r, s) for r, s in taken if where.matches(s, now)]
        left = tuple(s for _, s in taken if not where.matches(s, now))
        if confirm is not None and not confirm([s for _, s in chosen]):
            return PurgeReport((), tuple(s for _, s in taken), unseen)
        purged = []
        for received, shelved in chosen:
            if _delete(poison, received):
                taken.remove((received, shelved))
                purged.append(shelved)
                _log.info("poison entry %s purged from %s", shelved.id, poison.queue_name)
            else:  # its hold ran out: another reader has it now
                left += (shelved,)
    return PurgeReport(tuple(purged), left, unseen)
