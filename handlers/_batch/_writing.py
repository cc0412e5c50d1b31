"""A batch's write: folded over the stored header, written conditionally,
folded again on what a refused write tells (a rival's conflict, a message
stored before, an outbox row in the way, a token consumed before), until a
write holds."""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Protocol

from streamstone_py import (
    ConcurrencyConflictError,
    DuplicateEventError,
    IncludedOperationConflictError,
    Partition,
    RetryPolicy,
)

from .._cache import BatchHeader, HeaderCache
from .._messages._message import Message
from .._outcome import Found, LateDuplicates, Plan, ProcessorStats
from .._publish import Publisher
from .._store import OutputRecord, StateStore
from ._fold import Folder, consumed
from ._records import record_in_the_way
from ._strategy import Strategy
from ._tokens import Tokens

__all__ = ["Writer", "store_batch"]


class Writer(Protocol):
    """What a batch's write needs of the processor that runs it (``Processor``
    is one): named here, below it, so that this room never imports it."""

    store: StateStore
    cache: HeaderCache | None
    publisher: Publisher
    late_duplicates: LateDuplicates
    retry: RetryPolicy
    max_attempts: int
    stats: ProcessorStats
    _strategy: Strategy
    _tokens: Tokens

    @property  # read only: a lock is a context manager of its own type
    def _counting(self) -> AbstractContextManager[Any]: ...
    def _now(self) -> datetime: ...


def store_batch(
    processor: Writer, key: str, partition: Partition, messages: Sequence[Message]
) -> Plan:
    """Fold the batch over the stored header and write it, until a write
    holds (or nothing needs writing): the plan that was stored."""
    folder = Folder(
        processor._strategy,
        processor._now,
        processor.late_duplicates,
        getattr(processor.publisher, "check", None),
        processor._tokens,
    )
    stored: dict[str, Found] = {}
    records: dict[str, OutputRecord] = {}
    header = BatchHeader(processor.store, processor.cache, partition)
    conflicts = 0
    while True:
        stream = header.stream()
        plan = folder.fold(key, messages, stream, stored, records)
        if header.guessing and not confirmed_by_write(plan):
            header.read_instead()  # decide these outcomes on the stored header
            continue
        if not plan.events:
            return plan
        try:
            written = processor.store.write(stream, plan.events)
            header.written(stream, written.stream)
            return plan
        except ConcurrencyConflictError as exc:
            keep_committed(exc, plan, stored)
            if header.refused(exc.current):
                continue  # the guess was stale: not a rival's conflict
            conflicts += 1
            with processor._counting:
                processor.stats.conflicts_retried += 1
            if conflicts >= processor.max_attempts:
                raise
            time.sleep(processor.retry.delay(conflicts))
            header.read_instead()  # after the pause, read afresh
        except DuplicateEventError as exc:
            # Stored before (an earlier delivery or a rival): resolve it and
            # the batch's other stored messages as duplicates.
            keep_committed(exc, plan, stored)
            unresolved = list({m.id: m for m in messages if m.id not in stored}.values())
            stored.update(processor._strategy.replay_window(key, unresolved, exc.id))
            header.read_instead()
        except IncludedOperationConflictError as exc:
            keep_committed(exc, plan, stored)
            spent = None
            if exc.operation == "delete":
                row_key = str(exc.entity.get("RowKey", ""))
                spent = processor._tokens.consumed(messages, row_key)
            if spent is not None:  # its token is gone: processed before, however long ago
                stored[spent.id] = consumed(spent)
                header.read_instead()
                continue
            id_digest = record_in_the_way(processor.store, exc)
            if id_digest is not None:  # published by an earlier batch: fold again knowing it
                record = processor.store.output_record(partition, id_digest)
                if record is not None:  # else removed by retention meanwhile: insert it again
                    records[id_digest] = record
                header.read_instead()
                continue
            found = processor._strategy.owner(messages, exc)
            if found is None:
                raise
            stored[found.id] = folder.replay_or_error(key, found)
            header.read_instead()


def confirmed_by_write(plan: Plan) -> bool:
    """Whether the plan's write, if it succeeds, proves every outcome right.

    A conditional write succeeds only on the header the plan folded over, so
    completed messages (and their copies inside the batch) are right.
    Anything else was decided without a write, on a header that may be
    stale: an abandoned message, a duplicate of a stored one.
    """
    if not plan.events:
        return False
    done = {s.message.id for s in plan.steps if s.status == "completed"}
    return all(
        s.status == "completed" or (s.status == "duplicate" and s.message.id in done)
        for s in plan.steps
    )


def keep_committed(
    error: DuplicateEventError | ConcurrencyConflictError | IncludedOperationConflictError,
    plan: Plan,
    stored: dict[str, Found],
) -> None:
    """Earlier transactions of a split write committed: those messages are done.

    Their header holds the state after them, so the next fold starts there
    and reports them as completed by this call, with their outputs.
    """
    if error.committed is None:
        return
    ids = {e.id for e in error.committed.events}
    for step in plan.steps:
        if step.status == "completed" and step.message.id in ids:
            stored[step.message.id] = step
