"""Retention: old versions go, the newest state stays, and the window is explicit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.data.tables import TableClient

from handlers import (
    DuplicateOutsideWindowError,
    HeaderCache,
    InMemoryPublisher,
    Message,
    Processor,
)
from handlers._outcome import StrategyName
from handlers.examples import shooting_range
from streamstone_py import Stream
from tests.helpers import rows
from tests.test_handlers_scenarios import count_store_calls


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(minutes=1)
        return self.now


def fill(
    table: TableClient, strategy: StrategyName, key: str, count: int, **kwargs: Any
) -> tuple[Processor[Any], list[Message]]:
    clock = Clock()
    p = Processor(
        shooting_range, table, InMemoryPublisher(), strategy=strategy, clock=clock, **kwargs
    )
    messages = [Message("round", key, "StartNewRound")]
    messages += [Message(f"shot-{n}", key, "FireAt", {"position": n}) for n in range(1, count)]
    p.process_batch(key, messages)
    return p, messages


def test_keep_last_removes_older_versions_and_keeps_the_state(
    table: TableClient, strategy: StrategyName, game: str
) -> None:
    p, messages = fill(table, strategy, game, 10)
    newest = p.load_state(game, "x")

    removed = p.retain(game, keep_last=3)

    # The state strategy keeps the version before the last three: the oldest
    # of them is replayed on its state.
    kept = 4 if strategy == "state" else 3
    assert removed == 10 - kept
    assert p.load_state(game, "x") == newest
    events = Stream.read(p.store.partition(game)).events
    assert [e.id for e in events] == [m.id for m in messages[-kept:]]
    outbox_rows = sorted(k for k in rows(p.store.partition(game)) if "|OB-" in k)
    if strategy == "outbox":
        assert outbox_rows == sorted(f"ShootingRange|OB-{m.id}" for m in messages[-3:])
    else:
        assert outbox_rows == []
    assert p.retain(game, keep_last=3) == 0


def test_older_than_removes_by_the_time_of_first_processing(
    table: TableClient, strategy: StrategyName, game: str
) -> None:
    p, messages = fill(table, strategy, game, 10)  # processed at minutes 1..10 of the clock
    p.clock = lambda: datetime(2026, 1, 1, 0, 10, 30, tzinfo=UTC)

    removed = p.retain(game, older_than=timedelta(minutes=4))

    # Answered: the versions processed at minutes 7, 8, 9 and 10 (less than 4 minutes
    # before 10:30); the state strategy keeps minute 6 too, the state version 7 needs.
    first_kept = 5 if strategy == "state" else 6
    assert removed == first_kept
    assert [e.id for e in Stream.read(p.store.partition(game)).events] == [
        m.id for m in messages[first_kept:]
    ]
    assert p.retain(game, keep_last=5, older_than=timedelta(minutes=1)) == 0  # keep_last keeps them


def test_late_duplicates_are_refused_or_processed_as_configured(
    table: TableClient, game: str
) -> None:
    p, messages = fill(table, "state", game, 6)
    p.retain(game, keep_last=2)
    watermark = Stream.open(p.store.partition(game)).properties["Watermark"]
    assert watermark == datetime(2026, 1, 1, 0, 3, tzinfo=UTC)  # the newest removed version's time

    old = messages[1]
    stale = Message(old.id, game, old.type, old.body, {"sent_at": "2026-01-01T00:01:00+00:00"})
    fresh = Message(
        "shot-new", game, "FireAt", {"position": 1}, {"sent_at": "2026-01-01T00:30:00+00:00"}
    )
    refused, accepted = p.process_batch(game, [stale, fresh])

    assert refused.status == "abandoned"
    assert isinstance(refused.error, DuplicateOutsideWindowError)
    assert "before the retention watermark 2026-01-01T00:03:00+00:00" in str(refused.error)
    assert refused.error.reason == "it was sent before retention removed the versions of its time"
    assert refused.error.sent_at == datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
    assert refused.error.watermark == datetime(2026, 1, 1, 0, 3, tzinfo=UTC)
    assert (refused.error.handler, refused.error.message_id) == ("ShootingRange", old.id)
    assert "?" not in str(refused.error)
    assert accepted.status == "completed"

    lenient = Processor(shooting_range, table, InMemoryPublisher(), late_duplicates="process")
    (again,) = lenient.process_batch(game, [stale])
    assert again.status == "completed"  # its record is gone: handled as a new message
    # A duplicate whose record is still kept is detected whatever its sent_at says.
    (kept,) = p.process_batch(
        game,
        [
            Message(
                messages[-1].id,
                game,
                "FireAt",
                messages[-1].body,
                {"sent_at": "2020-01-01T00:00:00+00:00"},
            )
        ],
    )
    assert kept.status == "duplicate"


def test_retain_arguments(table: TableClient, game: str) -> None:
    p, _ = fill(table, "state", game, 3)
    with pytest.raises(ValueError, match="give keep_last, older_than, or both"):
        p.retain(game)
    with pytest.raises(ValueError, match="keep_last must be an int >= 0"):
        p.retain(game, keep_last=-1)
    assert p.retain(game + "-missing", keep_last=1) == 0
    assert p.retain(game, keep_last=0) == 3
    assert Stream.read(p.store.partition(game)).events == ()
    assert p.load_state(game, "x").version == 3


def test_keep_from_keeps_that_version_and_later_whatever_the_bounds(
    table: TableClient, strategy: StrategyName, game: str
) -> None:
    p, messages = fill(table, strategy, game, 10)

    # keep_last=0 alone would keep only the newest; keep_from=7 keeps 7 to 10
    # (and, under the state strategy, 6: a duplicate of 7 is replayed on it).
    removed = p.retain(game, keep_last=0, keep_from=7)

    kept = [m.id for m in messages[5 if strategy == "state" else 6 :]]
    assert removed == 10 - len(kept)
    assert [e.id for e in Stream.read(p.store.partition(game)).events] == kept
    again = p.process_batch(game, messages[6:])
    assert [o.status for o in again] == ["duplicate"] * 4
    with pytest.raises(ValueError, match="keep_from must be an int >= 1, got 0"):
        p.retain(game, keep_last=1, keep_from=0)


def test_with_a_cache_a_retain_with_nothing_to_remove_makes_no_request(
    table: TableClient, game: str
) -> None:
    p, _ = fill(table, "state", game, 5, cache=HeaderCache())
    calls = count_store_calls(p)

    assert p.retain(game, keep_last=4) == 0  # versions 1-5: the 4 newest and the one before
    assert p.retain(game, keep_last=9, keep_from=2) == 0
    assert calls == []
    assert p.retain(game, keep_last=3) == 1  # now there is something: it reads
    assert calls[:1] == ["open"]


def test_at_least_waits_until_that_many_versions_can_go(table: TableClient, game: str) -> None:
    p, _ = fill(table, "state", game, 5, cache=HeaderCache())
    calls = count_store_calls(p)

    # Versions 1-5, keep_last=1: 5 and the one before stay, 3 could go.
    assert p.retain(game, keep_last=1, at_least=4) == 0
    assert calls == []  # the cached header shows too little: no request
    p.process_batch(game, [Message("shot-5", game, "FireAt", {"position": 5})])
    assert p.retain(game, keep_last=1, at_least=4) == 4
    assert [e.id for e in Stream.read(p.store.partition(game)).events] == ["shot-4", "shot-5"]
    uncached = Processor(shooting_range, table, InMemoryPublisher())
    uncached.process_batch(game, [Message("shot-6", game, "FireAt", {"position": 6})])
    assert uncached.retain(game, keep_last=1, at_least=2) == 0  # only version 5 could go
    assert [e.id for e in Stream.read(p.store.partition(game)).events] == [
        "shot-4", "shot-5", "shot-6"
    ]  # fmt: skip
    for bad in (0, True, "2"):
        with pytest.raises(ValueError, match=f"at_least must be an int >= 1, got {bad!r}"):
            p.retain(game, keep_last=1, at_least=bad)  # type: ignore[arg-type]
