"""Writes whose outcome is unknown, and conflicts: what every writing verb
shares. A write is sent; when no answer (or an ambiguous one) comes back,
the stream is read to find out whether it committed, instead of guessing."""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from typing import Final, TypeVar

from azure.core.exceptions import AzureError

from ._errors import ConcurrencyConflictError, StreamBeingDeletedError
from ._header_type import H
from ._partition import Partition
from ._rows import header_row, is_deleted, stream_from_row
from ._transport._protocol import Steps, pause
from ._transport._retry import is_ambiguous

__all__ = ["CONFLICT", "NOT_APPLIED", "Unresolved", "attempt", "conflict", "refuse_tombstone"]

T = TypeVar("T")


class Unresolved(enum.Enum):
    NOT_APPLIED = "not applied"  # the stream is as before: sending again is safe
    CONFLICT = "conflict"  # the stream changed, and not by us


NOT_APPLIED: Final = Unresolved.NOT_APPLIED
CONFLICT: Final = Unresolved.CONFLICT

#: Reports how each write whose outcome was unknown got resolved (INFO records
#: with an ``outcome`` attribute: "committed", "not applied" or "conflict").
log: Final = logging.getLogger("streamstone_py")


def attempt(
    partition: Partition,
    send: Callable[[], Steps[T]],
    resolve: Callable[[], Steps[T | Unresolved]],
    header_type: type[H],
) -> Steps[T]:
    """Send a write; when its outcome is unknown, find out instead of guessing.

    After an ambiguous failure (no answer, or 408/5xx), ``resolve`` reads the
    stream: unchanged means nothing was applied and the write is sent again
    (bounded by the partition's retry policy); our own rows mean it committed
    and that outcome is returned; a tombstone is :class:`StreamBeingDeletedError`;
    anything else is a concurrency conflict. A
    definite failure that follows an ambiguous attempt is checked the same
    way, because the earlier attempt may be what changed the stream. Every
    write is conditional (header ETag, or insert of the header), so at most
    one attempt can ever commit.
    """
    doubtful = False
    tries = 0
    while True:
        tries += 1
        try:
            return (yield from send())
        except AzureError as exc:
            ambiguous = is_ambiguous(exc)
            if not ambiguous and not doubtful:
                raise  # a definite answer about our only attempt: the verb maps it
            doubtful = True
            outcome = yield from resolve()
            if ambiguous:
                found = "committed" if not isinstance(outcome, Unresolved) else outcome.value
                log.info(
                    "write to %s had no answer (%s); resolved by reading: %s",
                    partition,
                    type(exc).__name__,
                    found,
                    extra={"outcome": found},
                )
            if outcome is CONFLICT and ambiguous:
                reason = "the stream changed while the outcome of a write was unknown"
                raise (yield from conflict(partition, reason, exc, header_type)) from exc
            if outcome is CONFLICT or (outcome is NOT_APPLIED and not ambiguous):
                raise exc  # none of ours applied: the definite failure stands
            if outcome is NOT_APPLIED:
                if tries >= partition.retry.attempts:
                    raise exc
                yield from pause(tries, exc)
                continue
            return outcome


def refuse_tombstone(
    partition: Partition, cause: Exception, header_type: type[H]
) -> Steps[H | None]:
    """After a write conflicted: if a delete has left a tombstone, say so, and how
    to finish it; otherwise the stream as stored now (None: there is none)."""
    row = yield from header_row(partition)
    if row is None:
        return None
    if is_deleted(row):
        raise StreamBeingDeletedError(partition) from cause
    return stream_from_row(partition, row, header_type)


def conflict(
    partition: Partition, reason: str, cause: Exception, header_type: type[H]
) -> Steps[ConcurrencyConflictError[H]]:
    """The conflict to raise, with the stream read after it (or the pending delete)."""
    current = yield from refuse_tombstone(partition, cause, header_type)
    error: ConcurrencyConflictError[H] = ConcurrencyConflictError(partition, reason)
    error.current = current
    return error
