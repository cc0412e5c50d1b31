"""Sending poisoned messages back to their queue once their cause is fixed.

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
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from azure.storage.queue import QueueClient

from .._messages._envelope import encode_envelope, read_queue_text
from ._shelf import PoisonFilter, ShelvedEntry, held

__all__ = ["SendBackReport", "send_back"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SendBackReport:
    """What a send-back did (or, in a dry run, would do): the entries sent,
    each with the queue it went to, and those left (not matching, or unreadable)."""

    sent: tuple[tuple[ShelvedEntry, str], ...]
    left: tuple[ShelvedEntry, ...]
    dry_run: bool


def _text(shelved: ShelvedEntry) -> str:
    assert shelved.entry is not None
    assert shelved.message is not None
    try:
        read_queue_text(shelved.entry.content)
    except ValueError:  # no id of its own: the one the consumer gave it, written in
        return base64.b64encode(encode_envelope(shelved.message).encode()).decode()
    return shelved.entry.content


def _queue_beside(poison: QueueClient, name: str) -> QueueClient:
    url, _, query = poison.url.partition("?")
    url = f"{url.rsplit('/', 1)[0]}/{name}" + (f"?{query}" if query else "")
    return QueueClient.from_queue_url(url, credential=poison.credential)


def send_back(
    poison: QueueClient,
    where: PoisonFilter | None = None,
    *,
    to: QueueClient | None = None,
    dry_run: bool = False,
    hold: timedelta = timedelta(minutes=5),
) -> SendBackReport:
    """Send the matching entries of ``poison`` back to the queue each came
    from (or ``to``), then delete each; ``dry_run`` sends and deletes
    nothing. Entries that cannot be read are left, and logged. ``hold``
    must outlast the whole send-back: entries not taken come back after it."""
    now, where = datetime.now(UTC), where or PoisonFilter()
    sent: list[tuple[ShelvedEntry, str]] = []
    left: list[ShelvedEntry] = []
    with held(poison, hold) as taken:
        for received, shelved in list(taken):
            if shelved.error is not None:
                _log.warning("poison entry %s left in %s: %s", shelved.id, poison.queue_name,
                             shelved.error)  # fmt: skip
            if shelved.message is None or not where.matches(shelved, now):
                left.append(shelved)
                continue
            assert shelved.entry is not None
            target = to or _queue_beside(poison, shelved.entry.queue)
            sent.append((shelved, target.queue_name))
            if dry_run:
                continue
            due = shelved.message.due
            delay = 0 if due is None else max(0, math.ceil((due - now).total_seconds()))
            # Hidden until due, then it lives as long as any message would (7 days).
            life = delay + 7 * 24 * 3600 if delay else None
            target.send_message(_text(shelved), visibility_timeout=delay or None, time_to_live=life)
            poison.delete_message(received)  # only once it is sent
            taken.remove((received, shelved))
            _log.info("poisoned message %r sent back to %s", shelved.message.id,
                      target.queue_name)  # fmt: skip
    return SendBackReport(tuple(sent), tuple(left), dry_run)
