"""Crashes at every step of processing, then redelivery: same state, same outputs, no ghosts.

A crash is a BaseException, so nothing in the processor can mistake it for an
outcome: it ends the worker as a killed process would. The broker then
delivers the same messages again, to a fresh worker.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from azure.data.tables import TableClient

from handlers import InMemoryPublisher, Message, Processor, StateStore
from handlers._outcome import StrategyName
from handlers.examples import shooting_range


class Crash(BaseException):
    """The worker died here."""


class CrashingStore(StateStore):
    """The real store, with one crash at a chosen point."""

    def __init__(self, table: TableClient, point: str) -> None:
        super().__init__(
            table, shooting_range.name, Processor(shooting_range, table, InMemoryPublisher()).retry
        )
        self.point = point

    def _maybe(self, point: str) -> None:
        if self.point == point:
            self.point = "done"
            raise Crash(point)

    def open(self, partition: Any) -> Any:
        stream = super().open(partition)
        self._maybe("after load")
        return stream

    def write(self, stream: Any, events: Any) -> Any:
        self._maybe("before store")
        result = super().write(stream, events)
        self._maybe("after store")
        return result

    def mark_dispatched(
        self, partition: Any, message_ids: Any, *, keep_outputs: bool = False
    ) -> None:
        self._maybe("before marking dispatched")
        super().mark_dispatched(partition, message_ids, keep_outputs=keep_outputs)


class CrashingPublisher(InMemoryPublisher):
    """Publishes the first half of what it is given, then the worker dies."""

    def __init__(self, sink: InMemoryPublisher) -> None:
        super().__init__()
        self.sink = sink

    def publish(self, messages: Sequence[Message]) -> None:
        self.sink.publish(messages[: len(messages) // 2])
        raise Crash("halfway through publishing")


def messages_for(game: str) -> list[Message]:
    shots = [Message(f"shot-{n}", game, "FireAt", {"position": n * 7 % 100}) for n in range(1, 9)]
    return [Message("round-1", game, "StartNewRound"), *shots]


def bodies(messages: Iterable[Message]) -> list[str]:
    # Output ids derive from the key too, so only types and bodies compare across keys.
    return [repr((m.type, sorted({**m.body, "game": None}.items()))) for m in messages]


POINTS = ["after load", "before store", "after store", "halfway through publishing"]
# Only the outbox marks outputs dispatched after publishing.
CASES = [
    *((s, p) for s in ("state", "outbox") for p in POINTS),
    ("outbox", "before marking dispatched"),
]


@pytest.mark.parametrize(("strategy", "point"), CASES)
def test_crash_then_redelivery_gives_the_clean_result(
    table: TableClient, strategy: StrategyName, game: str, point: str
) -> None:
    messages = messages_for(game)
    clean_publisher = InMemoryPublisher()
    clean = Processor(shooting_range, table, clean_publisher, strategy=strategy)
    clean_key = game + "-clean"
    clean.process_batch(clean_key, [Message(m.id, clean_key, m.type, m.body) for m in messages])

    sink = InMemoryPublisher()
    first, rest = messages[:3], messages[3:]
    Processor(shooting_range, table, sink, strategy=strategy).process_batch(game, first)
    publisher: Any = CrashingPublisher(sink) if point.startswith("halfway") else sink
    store = CrashingStore(table, "never" if point.startswith("halfway") else point)
    crashing = Processor(shooting_range, table, publisher, strategy=strategy, store=store)
    before = len(sink.deliveries)

    with pytest.raises(Crash, match=point):
        crashing.process_batch(game, rest)

    if point in ("after load", "before store"):
        assert len(sink.deliveries) == before  # nothing stored, so nothing published: no ghost
        assert clean.load_state(game, "x").version == 3
    redelivered = Processor(shooting_range, table, sink, strategy=strategy)
    outcomes = redelivered.process_batch(game, rest)

    stored_before_crash = point not in ("after load", "before store")
    assert [o.status for o in outcomes] == [
        "duplicate" if stored_before_crash else "completed"
    ] * len(rest)
    assert clean.load_state(game, "x").state == clean.load_state(clean_key, "x").state
    assert clean.load_state(game, "x").version == len(messages)
    # Every expected output was published, each identical to the clean run's; none is extra.
    assert sorted(bodies(sink.messages.values())) == sorted(
        bodies(clean_publisher.messages.values())
    )
    assert sink.divergent == []
    if point == "before marking dispatched":
        # The outbox re-sent its stored outputs once, and marked them this time.
        assert redelivered.process_batch(game, rest)[0].outputs == ()
