"""What differs between the two ways to answer a duplicate.

- :class:`StateBased` stores a state version per message and handles a
  duplicate again on the state before its original: the handler must be
  deterministic, and nothing else is stored.
- :class:`Outbox` also stores each message's outputs in an include row and
  sends them again for a duplicate until they are marked dispatched: the
  handler need not be deterministic.

Everything else (the fold, the write loop, publishing last, retention's cut)
is shared by the processor.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from streamstone_py import Include, IncludedOperationConflictError, Partition, split_binary

from .._compression import pack_stored
from .._errors import DuplicateOutsideWindowError
from .._messages._codec import unpack
from .._messages._message import Message
from .._outcome import Dispatch, Found, Step, StrategyName
from .._store import StoredVersion
from ._replay import Replayer

__all__ = ["OUTBOX_ROW_REMOVED", "Outbox", "StateBased", "Strategy", "strategy_of"]

OUTBOX_ROW_REMOVED = "its outbox row was removed by retention"


class Strategy(ABC):
    """What the processor asks of a strategy; each answer is one of its choices."""

    name: StrategyName

    def __init__(self, replayer: Replayer, dispatch: Dispatch) -> None:
        self.replayer = replayer
        self.store = replayer.store
        self.dispatch = dispatch

    @abstractmethod
    def replay(self, key: str, message: Message) -> Step:
        """A message found stored: what it yields as a duplicate."""

    @abstractmethod
    def replay_window(
        self, key: str, unresolved: Sequence[Message], anchor: str
    ) -> dict[str, Found]:
        """The batch's stored messages, starting from ``anchor`` that the write found."""

    @abstractmethod
    def repeated(self, earlier: Step) -> tuple[Message, ...]:
        """The outputs of a copy of ``earlier`` inside the same batch."""

    @abstractmethod
    def dispatches(self) -> bool:
        """Whether a completed message's outputs are marked dispatched once published."""

    @abstractmethod
    def includes(
        self, message_id: str, encoded_outputs: bytes, produced: datetime
    ) -> list[Include]:
        """Rows written in the same transaction as the message's version."""

    @abstractmethod
    def mark_dispatched(self, partition: Partition, message_ids: Sequence[str]) -> None:
        """Record that these messages' outputs are delivered."""

    @abstractmethod
    def owner(
        self, messages: Sequence[Message], error: IncludedOperationConflictError
    ) -> Message | None:
        """The message whose include row already exists, if that is what failed."""

    @abstractmethod
    def hold_bound(self, cut: int, version: int) -> int:
        """Retention's cut below ``version`` (the newest), lowered by what this
        strategy always keeps: the part of :meth:`hold` that needs no read."""

    @abstractmethod
    def hold(
        self, partition: Partition, candidates: Sequence[StoredVersion], cut: int, version: int
    ) -> int:
        """Retention's cut below ``version`` (the newest), lowered to keep what
        this strategy still needs of ``candidates`` (never above :meth:`hold_bound`)."""

    @abstractmethod
    def before_truncate(self, partition: Partition, removed: Sequence[StoredVersion]) -> None:
        """Remove what would outlive the versions retention removes."""


class StateBased(Strategy):
    name: StrategyName = "state"

    def replay(self, key: str, message: Message) -> Step:
        return self.replayer.replay(key, message)

    def replay_window(
        self, key: str, unresolved: Sequence[Message], anchor: str
    ) -> dict[str, Found]:
        return self.replayer.window(key, unresolved, anchor)

    def repeated(self, earlier: Step) -> tuple[Message, ...]:
        return earlier.outputs

    def dispatches(self) -> bool:
        return False

    def includes(
        self, message_id: str, encoded_outputs: bytes, produced: datetime
    ) -> list[Include]:
        return []

    def mark_dispatched(self, partition: Partition, message_ids: Sequence[str]) -> None:
        pass  # outputs are derived again, never stored: nothing to mark

    def owner(
        self, messages: Sequence[Message], error: IncludedOperationConflictError
    ) -> Message | None:
        return None

    def hold_bound(self, cut: int, version: int) -> int:
        # The oldest answered duplicate is replayed on the state of the version before it.
        return cut - 1 if cut <= version else cut

    def hold(
        self, partition: Partition, candidates: Sequence[StoredVersion], cut: int, version: int
    ) -> int:
        return self.hold_bound(cut, version)

    def before_truncate(self, partition: Partition, removed: Sequence[StoredVersion]) -> None:
        pass  # the versions are all there is


class Outbox(Strategy):
    name: StrategyName = "outbox"

    def replay(self, key: str, message: Message) -> Step:
        record = self.store.outbox(self.store.partition(key), message.id)
        if record is None:
            raise self.replayer.outside(message.id, OUTBOX_ROW_REMOVED)
        if record.outputs is None or (record.dispatched and self.dispatch == "after_publish"):
            return Step(message, "duplicate")
        outputs = tuple(
            dataclasses.replace(Message.decode(o), produced=record.produced)
            for o in unpack(record.outputs)
        )
        return Step(message, "duplicate", outputs=outputs, dispatch=True)

    def replay_window(
        self, key: str, unresolved: Sequence[Message], anchor: str
    ) -> dict[str, Found]:
        # The outbox row itself says whether a message is stored: probe each.
        results: dict[str, Found] = {}
        for message in unresolved:
            try:
                results[message.id] = self.replay(key, message)
            except DuplicateOutsideWindowError as exc:
                if message.id == anchor:
                    results[message.id] = exc
                # no row: not stored, so it is new
        return results

    def repeated(self, earlier: Step) -> tuple[Message, ...]:
        return ()  # the first copy's outputs are sent once, from its outbox row

    def dispatches(self) -> bool:
        return True

    def includes(
        self, message_id: str, encoded_outputs: bytes, produced: datetime
    ) -> list[Include]:
        stored = pack_stored(encoded_outputs, self.store.compression)
        outputs: dict[str, Any] = split_binary("Outputs", stored)
        # When the outputs were first produced: they carry it again when re-sent.
        return [self.store.outbox_include(message_id, {**outputs, "Produced": produced})]

    def mark_dispatched(self, partition: Partition, message_ids: Sequence[str]) -> None:
        self.store.mark_dispatched(
            partition, message_ids, keep_outputs=self.dispatch == "by_caller"
        )

    def owner(
        self, messages: Sequence[Message], error: IncludedOperationConflictError
    ) -> Message | None:
        # An outbox row outlives its version when retention was interrupted by an
        # older release: its message was processed, so it is a duplicate.
        if error.operation != "insert":
            return None
        row_key = error.entity.get("RowKey")
        for message in messages:
            if self.store.outbox_row_key(message.id) == row_key:
                return message
        return None

    def hold_bound(self, cut: int, version: int) -> int:
        return cut  # what is held depends on the outbox rows: only a read tells

    def hold(
        self, partition: Partition, candidates: Sequence[StoredVersion], cut: int, version: int
    ) -> int:
        # Never remove a version whose outputs were not dispatched, nor any after it.
        if not candidates:
            return cut
        pending = self.store.undispatched(partition)
        held = [r.version for r in candidates if r.message_id in pending]
        return min(cut, min(held)) if held else cut

    def before_truncate(self, partition: Partition, removed: Sequence[StoredVersion]) -> None:
        # Before the versions: once their ids are gone, these rows could no
        # longer be found, and would outlive them.
        self.store.delete_outbox(partition, [r.message_id for r in removed])


def strategy_of(name: StrategyName, replayer: Replayer, dispatch: Dispatch) -> Strategy:
    if name == "outbox":
        return Outbox(replayer, dispatch)
    return StateBased(replayer, dispatch)
