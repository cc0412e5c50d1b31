"""Regression tests for the exactly-once holes a review found (one section per case).

Each test runs against Azurite and asserts exact states, versions and outputs,
most often by comparing with the same messages processed one by one on a
clean key: "the same result as one by one, always".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from azure.data.tables import TableClient, UpdateMode
from azure.data.tables.aio import TableClient as AsyncTableClient

from handlers import (
    DuplicateOutsideWindowError,
    HandlerContext,
    InMemoryPublisher,
    KeyState,
    KeyVersion,
    Message,
    Processor,
    StateStore,
    aio,
    handler,
)
from handlers._messages._codec import digest, pack
from handlers._outcome import StrategyName
from handlers._store import RETAIN_CUT, StoredVersion
from streamstone_py import Partition, Stream
from tests.faults import Crash, CrashingTransport, FaultPlan, FaultyTransport
from tests.helpers import rows, wait

# --- handlers under test ---------------------------------------------------------


@dataclass
class Tally:
    count: int = 0
    seen: list[str] = field(default_factory=list)


@handler("Tally", Tally, types=["Add", "Capture", "Huge"])
def tally(state: Tally, message: Message, ctx: HandlerContext) -> None:
    if message.type == "Capture":
        ctx.capture("blob", lambda: "c" * 70_000)  # over the 64 KiB of one property
    if message.type == "Huge":
        ctx.publish("Big", {"blob": "b" * 1_100_000})  # over one entity's 1 MiB
    state.count += 1
    state.seen.append(message.id)
    ctx.publish("Counted", {"count": state.count, "of": message.id})


@dataclass
class Account:
    balance: int = 0
    note: str = ""


@handler("Account", Account, types=["Deposit", "Withdraw"])
def account(state: Account, message: Message, ctx: HandlerContext) -> None:
    amount = int(message.body["amount"])
    if message.type == "Withdraw":
        if amount > state.balance:  # raises rather than publishing a rejection
            raise ValueError(f"insufficient funds: {state.balance} < {amount}")
        amount = -amount
    state.balance += amount
    state.note = f"last: {message.id}"
    ctx.publish("Balance", {"balance": state.balance, "after": message.id})


#: Where ``account`` raises its refusal, as a handler error's reason names it.
REFUSAL_LINE = account._fn.__code__.co_firstlineno + 5  # type: ignore[attr-defined]


@dataclass
class AccountV2:
    """``Account`` after a deploy: ``note`` removed, ``fee_rate`` added with a default."""

    balance: int = 0
    fee_rate: float = 0.0


@handler("Account", AccountV2, types=["Deposit", "Withdraw"])
def account_v2(state: AccountV2, message: Message, ctx: HandlerContext) -> None:
    amount = int(message.body["amount"])
    if message.type == "Withdraw":
        if amount > state.balance:
            raise ValueError(f"insufficient funds: {state.balance} < {amount}")
        amount = -amount
    state.balance += amount - int(abs(amount) * state.fee_rate)
    ctx.publish("Balance", {"balance": state.balance, "after": message.id})


# --- helpers ---------------------------------------------------------------------


def adds(key: str, ids: Sequence[str]) -> list[Message]:
    return [Message(i, key, "Add", {}) for i in ids]


def make(
    table: TableClient,
    strategy: StrategyName,
    publisher: InMemoryPublisher | None = None,
    h: Any = tally,
) -> Processor[Any]:
    return Processor(h, table, publisher or InMemoryPublisher(), strategy=strategy)


def history(p: Processor[Any], key: str) -> list[tuple[int, str, Any]]:
    """Every stored version of a key: (version, message id, state as a dict)."""
    events = Stream.read(p.store.partition(key), 1, 10_000).events
    out = []
    for e in events:
        stored = StoredVersion.from_event(e)
        out.append((stored.version, stored.message_id, vars(p.handler.decode_state(stored.state))))
    return out


def newest(p: Processor[Any], key: str) -> tuple[int, Any]:
    loaded = p.load_state(key, "no-such-message")
    return loaded.version, vars(loaded.state)


def one_by_one(
    table: TableClient,
    strategy: StrategyName,
    key: str,
    messages: Sequence[Message],
    h: Any = tally,
) -> tuple[Processor[Any], InMemoryPublisher]:
    """The reference: each message alone, in order, on a clean key."""
    publisher = InMemoryPublisher()
    p = make(table, strategy, publisher, h)
    for m in messages:
        p.process(Message(m.id, key, m.type, m.body, m.headers))
    return p, publisher


def bodies(publisher: InMemoryPublisher) -> list[tuple[str, Any]]:
    """Published outputs without their ids and keys, in first-publication order."""
    return [(m.type, m.body) for m in publisher.messages.values()]


def faulty_client(connection_string: str, table: TableClient, transport: Any) -> TableClient:
    return TableClient.from_connection_string(
        connection_string, table.table_name, transport=transport
    )


# --- 1. a split batch write ------------------------------------------------------


def test_split_batch_that_meets_a_stored_duplicate_applies_each_message_once(
    table: TableClient, strategy: StrategyName, game: str
) -> None:
    publisher = InMemoryPublisher()
    p = make(table, strategy, publisher)
    ids = [f"m{i:03d}" for i in range(1, 52)]
    p.process(adds(game, ids[-1:])[0])  # the batch's last message is stored already

    outcomes = p.process_batch(game, adds(game, ids))  # 50 new: two transactions

    assert [o.status for o in outcomes] == ["completed"] * 50 + ["duplicate"]
    assert [o.version for o in outcomes] == [*range(2, 52), 1 if strategy == "state" else None]
    assert newest(p, game) == (51, {"count": 51, "seen": [ids[-1], *ids[:-1]]})
    ref, ref_publisher = one_by_one(table, strategy, game + "-ref", adds(game, [ids[-1], *ids]))
    assert history(p, game) == history(ref, game + "-ref")
    assert [o.outputs[0].body for o in outcomes[:50]] == [
        {"count": n, "of": i} for n, i in zip(range(2, 52), ids, strict=False)
    ]
    assert sorted(map(str, bodies(publisher))) == sorted(map(str, bodies(ref_publisher)))


@pytest.mark.parametrize("when", ["before", "after"])
def test_crash_between_the_transactions_of_a_batch_then_redelivery(
    table: TableClient, connection_string: str, strategy: StrategyName, game: str, when: str
) -> None:
    ids = [f"m{i:03d}" for i in range(1, 121)]  # three transactions under both strategies
    transport = CrashingTransport(at=2, when=when, method="POST", url_part="$batch")
    crashing = make(faulty_client(connection_string, table, transport), strategy)
    with pytest.raises(Crash):
        crashing.process_batch(game, adds(game, ids))
    per_transaction = 49 if strategy == "state" else 33
    done = per_transaction * (2 if when == "after" else 1)
    stored = Stream.open(Partition(table, game, "Tally"))
    assert stored.version == done
    # The header holds the state of the last stored message, not of the whole batch.
    assert newest(make(table, strategy), game) == (done, {"count": done, "seen": ids[:done]})

    publisher = InMemoryPublisher()
    outcomes = make(table, strategy, publisher).process_batch(game, adds(game, ids))

    assert [o.status for o in outcomes] == ["duplicate"] * done + ["completed"] * (120 - done)
    assert [o.version for o in outcomes] == [
        v if strategy == "state" or v > done else None for v in range(1, 121)
    ]
    p = make(table, strategy)
    assert newest(p, game) == (120, {"count": 120, "seen": ids})
    ref, ref_publisher = one_by_one(table, strategy, game + "-ref", adds(game, ids))
    assert history(p, game) == history(ref, game + "-ref")
    # Nothing was published before the crash: the redelivery publishes every output
    # (the state strategy replays them, the outbox sends its undispatched rows).
    assert bodies(publisher) == bodies(ref_publisher)


def test_rival_write_between_the_transactions_of_a_batch(
    table: TableClient, connection_string: str, strategy: StrategyName, game: str
) -> None:
    ids = [f"m{i:03d}" for i in range(1, 61)]

    def rival() -> None:
        make(table, strategy).process(Message("rival", game, "Add", {}))

    plan = (
        FaultPlan().add("pass", "POST", "$batch").add("before", "POST", "$batch", meanwhile=rival)
    )
    publisher = InMemoryPublisher()
    p = make(faulty_client(connection_string, table, FaultyTransport(plan)), strategy, publisher)

    outcomes = p.process_batch(game, adds(game, ids))

    assert plan.injected == ["pass POST", "before POST"]
    assert [o.status for o in outcomes] == ["completed"] * 60
    first = 49 if strategy == "state" else 33  # what the first transaction held
    assert [o.version for o in outcomes] == [*range(1, first + 1), *range(first + 2, 62)]
    order = [*ids[:first], "rival", *ids[first:]]
    assert newest(p, game) == (61, {"count": 61, "seen": order})
    ref, ref_publisher = one_by_one(table, strategy, game + "-ref", adds(game, order))
    assert history(p, game) == history(ref, game + "-ref")
    assert [o.outputs[0].body for o in outcomes] == [
        m.body for m in ref_publisher.deliveries if m.body["of"] != "rival"
    ]


# --- 2. a stored duplicate that fails on the newest state ------------------------


class DiesBeforePublishing(InMemoryPublisher):
    def publish(self, messages: Sequence[Message]) -> None:
        raise Crash("between store and publish")


def test_stored_duplicate_that_would_fail_on_the_newest_state_is_replayed(
    table: TableClient, strategy: StrategyName, game: str
) -> None:
    deposit = Message("d1", game, "Deposit", {"amount": 100})
    withdraw = Message("w1", game, "Withdraw", {"amount": 100})
    later = Message("d2", game, "Deposit", {"amount": 5})
    make(table, strategy, h=account).process(deposit)
    with pytest.raises(Crash):
        make(table, strategy, DiesBeforePublishing(), account).process(withdraw)
    assert make(table, strategy, h=account).load_state(game, "w1").is_duplicate

    publisher = InMemoryPublisher()
    p = make(table, strategy, publisher, account)
    outcomes = p.process_batch(game, [withdraw, later])  # w1 fails on the newest state (0)

    assert [(o.status, o.version) for o in outcomes] == [
        ("duplicate", 2 if strategy == "state" else None),
        ("completed", 3),
    ]
    assert [m.body for m in publisher.deliveries] == [
        {"balance": 0, "after": "w1"},
        {"balance": 5, "after": "d2"},
    ]
    assert newest(p, game) == (3, {"balance": 5, "note": "last: d2"})


# --- 3. a state class that evolves -----------------------------------------------


def test_duplicates_of_messages_handled_before_a_state_class_change_still_replay(
    table: TableClient, strategy: StrategyName, game: str
) -> None:
    first = make(table, strategy, h=account)
    old = [Message(f"d{i}", game, "Deposit", {"amount": 10 * i}) for i in (1, 2)]
    original = [first.process(m) for m in old]

    publisher = InMemoryPublisher()
    deployed = make(table, strategy, publisher, account_v2)  # gained fee_rate, lost note
    new = Message("d3", game, "Deposit", {"amount": 30})
    outcomes = deployed.process_batch(game, [*old, new])

    replayed = strategy == "state"
    assert [(o.status, o.version) for o in outcomes] == [
        ("duplicate", 1 if replayed else None),
        ("duplicate", 2 if replayed else None),
        ("completed", 3),
    ]
    if strategy == "state":
        assert [o.outputs for o in outcomes[:2]] == [o.outputs for o in original]
    assert outcomes[2].outputs[0].body == {"balance": 60, "after": "d3"}
    assert newest(deployed, game) == (3, {"balance": 60, "fee_rate": 0.0})


# --- 4. and 5. retention: interrupted, and undispatched outbox rows --------------


def fill(table: TableClient, strategy: StrategyName, key: str, count: int) -> list[Message]:
    messages = adds(key, [f"m{i:02d}" for i in range(1, count + 1)])
    make(table, strategy).process_batch(key, messages)
    return messages


def row_keys(table: TableClient, key: str) -> list[str]:
    return sorted(rows(Partition(table, key)))


def expected_rows(strategy: StrategyName, kept: Sequence[int], ids: Sequence[str]) -> list[str]:
    found = ["Tally|SS-HEAD"]
    for v in kept:
        found += [f"Tally|SS-SE-{v:010d}", f"Tally|SS-UID-{ids[v - 1]}"]
        if strategy == "outbox":
            found.append(f"Tally|OB-{ids[v - 1]}")
    return sorted(found)


# Every request retain() sends (7 for the state strategy, 9 for the outbox, counted
# below), crashed before it is sent or after it was applied.
REQUESTS = {"state": 7, "outbox": 9}
#: Each strategy with each request its retain sends: where a crash can fall.
RETAIN_CRASHES = [
    pytest.param(strategy, at, id=f"{strategy}-{at}")
    for strategy, count in REQUESTS.items()
    for at in range(1, count + 1)
]


def window(strategy: StrategyName, keep_last: int) -> range:
    """The versions of a 10-version stream that ``retain(keep_last=...)`` keeps: the
    state strategy also keeps the version before them, whose state the oldest
    answered duplicate is replayed on."""
    return range(11 - keep_last - (strategy == "state"), 11)


def interrupt_retain(
    table: TableClient,
    connection_string: str,
    strategy: StrategyName,
    game: str,
    keep_last: int,
    *,
    at: int,
    when: str,
) -> tuple[list[Message], list[str]]:
    """A 10-version stream whose ``retain(keep_last=...)`` crashed at request
    ``at``: its messages, and its rows before the call."""
    assert at <= REQUESTS[strategy], f"retain sends {REQUESTS[strategy]} requests under {strategy}"
    messages = fill(table, strategy, game, 10)
    untouched = row_keys(table, game)
    transport = CrashingTransport(at=at, when=when)
    with pytest.raises(Crash):
        make(faulty_client(connection_string, table, transport), strategy).retain(
            game, keep_last=keep_last
        )
    return messages, untouched


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize(("strategy", "at"), RETAIN_CRASHES)
@pytest.mark.parametrize(("first", "then"), [(3, 3), (1, 5)], ids=["same", "wider"])
def test_retain_interrupted_at_any_request_is_finished_by_the_next_call(
    table: TableClient,
    connection_string: str,
    strategy: StrategyName,
    game: str,
    at: int,
    when: str,
    first: int,
    then: int,
) -> None:
    # "wider": an operator's retain(keep_last=1) dies, and the retry keeps more.
    messages, untouched = interrupt_retain(
        table, connection_string, strategy, game, first, at=at, when=when
    )
    ids = [m.id for m in messages]
    started = row_keys(table, game) != untouched

    make(table, strategy).retain(game, keep_last=then)  # a fresh process

    # Every kept version keeps its id row (and its outbox row): what the
    # interrupted call started removing is finished, never left half done.
    found = row_keys(table, game)
    narrow, wide = window(strategy, first), window(strategy, then)
    assert found in (expected_rows(strategy, narrow, ids), expected_rows(strategy, wide, ids))
    kept = narrow if found == expected_rows(strategy, narrow, ids) else wide
    if started:
        assert kept == narrow
    assert Stream.open(Partition(table, game, "Tally")).first_version == kept[0]
    publisher = InMemoryPublisher()
    outcomes = make(table, strategy, publisher).process_batch(
        game, [messages[-1], Message("new", game, "Add", {})]
    )
    assert [(o.status, o.version) for o in outcomes] == [
        ("duplicate", 10 if strategy == "state" else None),
        ("completed", 11),
    ]
    assert newest(make(table, strategy), game) == (11, {"count": 11, "seen": [*ids, "new"]})


@pytest.mark.parametrize(("strategy", "at"), RETAIN_CRASHES)
def test_an_interrupted_cut_is_finished_by_a_call_with_a_larger_at_least(
    table: TableClient, connection_string: str, strategy: StrategyName, game: str, at: int
) -> None:
    # at_least postpones a new cut, never the end of an interrupted one.
    messages, untouched = interrupt_retain(
        table, connection_string, strategy, game, 3, at=at, when="after"
    )
    ids = [m.id for m in messages]
    header = Stream.open(Partition(table, game, "Tally"))
    recorded = header.properties.get(RETAIN_CUT)
    started = row_keys(table, game) != untouched

    # Alone, keep_last=3 with at_least=50 removes nothing: 10 versions hold 6 or 7.
    make(table, strategy).retain(game, keep_last=3, at_least=50)

    narrow = expected_rows(strategy, window(strategy, 3), ids)
    found = row_keys(table, game)
    if (isinstance(recorded, int) and recorded > 1) or started:
        assert found == narrow  # what the interrupted call began is finished
    else:
        assert found == untouched  # it had only read: nothing to finish, nothing new cut
    assert make(table, strategy).retain(game, keep_last=3, at_least=50) == 0


def test_a_write_between_an_interrupted_retain_and_the_next_keeps_the_recorded_cut(
    table: TableClient, connection_string: str, game: str
) -> None:
    messages = fill(table, "outbox", game, 10)
    ids = [m.id for m in messages]
    # Dies once the outbox rows are deleted (its first transaction), before the truncate.
    transport = CrashingTransport(at=1, when="after", method="POST", url_part="$batch")
    with pytest.raises(Crash):
        make(faulty_client(connection_string, table, transport), "outbox").retain(game, keep_last=1)
    assert "Tally|OB-m09" not in row_keys(table, game)
    make(table, "outbox").process(Message("m11", game, "Add", {}))

    make(table, "outbox").retain(game, keep_last=5)

    assert row_keys(table, game) == expected_rows("outbox", range(10, 12), [*ids, "m11"])
    assert newest(make(table, "outbox"), game) == (11, {"count": 11, "seen": [*ids, "m11"]})


def test_the_interruption_points_cover_every_request_of_retain(
    table: TableClient, connection_string: str, strategy: StrategyName, game: str
) -> None:
    fill(table, strategy, game, 10)
    counter = CrashingTransport(at=0)  # never crashes: counts the requests
    make(faulty_client(connection_string, table, counter), strategy).retain(game, keep_last=3)
    assert counter.seen == REQUESTS[strategy]


def test_an_orphaned_outbox_row_makes_its_message_a_duplicate_not_a_fault(
    table: TableClient, game: str
) -> None:
    # What an interrupted retention left behind before it became resumable: the
    # versions are gone but an outbox row stayed.
    messages = fill(table, "outbox", game, 4)
    p = make(table, "outbox")
    stream = Stream.open(p.store.partition(game))
    Stream.truncate(stream, 3)
    assert "Tally|OB-m01" in row_keys(table, game)

    outcomes = p.process_batch(game, [messages[0], Message("new", game, "Add", {})])

    assert [(o.status, o.version) for o in outcomes] == [("duplicate", None), ("completed", 5)]
    assert newest(p, game)[0] == 5


class SkipsMarking(StateStore):
    """A worker that died right after publishing, before marking its outputs dispatched."""

    def mark_dispatched(
        self, partition: Partition, message_ids: Sequence[str], *, keep_outputs: bool = False
    ) -> None:
        raise Crash("before marking dispatched")


def test_retention_keeps_outbox_versions_that_were_never_dispatched(
    table: TableClient, game: str
) -> None:
    messages = adds(game, [f"m{i}" for i in range(1, 6)])
    p = make(table, "outbox")
    p.process_batch(game, messages[:2])
    undispatched = Processor(
        tally,
        table,
        InMemoryPublisher(),
        strategy="outbox",
        store=SkipsMarking(table, "Tally", p.retry),
    )
    with pytest.raises(Crash):
        undispatched.process(messages[2])
    p.process_batch(game, messages[3:])

    removed = p.retain(game, keep_last=1)

    assert removed == 2  # m3's version and everything after it stay
    assert row_keys(table, game) == expected_rows("outbox", [3, 4, 5], [m.id for m in messages])
    publisher = InMemoryPublisher()
    (again,) = make(table, "outbox", publisher).process_batch(game, [messages[2]])
    assert (again.status, again.version) == ("duplicate", None)
    assert [m.body for m in publisher.deliveries] == [{"count": 3, "of": "m3"}]
    assert newest(p, game)[0] == 5


# --- 6. the oldest kept version ----------------------------------------------------


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_keep_last_n_answers_the_duplicates_of_the_last_n_messages(
    table: TableClient, strategy: StrategyName, game: str, keep: int
) -> None:
    messages = fill(table, strategy, game, 6)
    make(table, strategy).retain(game, keep_last=keep)

    publisher = InMemoryPublisher()
    p = make(table, strategy, publisher)
    outcomes = p.process_batch(game, messages[-keep:])

    assert [(o.status, o.version) for o in outcomes] == [
        ("duplicate", v if strategy == "state" else None) for v in range(7 - keep, 7)
    ]
    if strategy == "state":
        assert [m.body for m in publisher.deliveries] == [
            {"count": v, "of": f"m{v:02d}"} for v in range(7 - keep, 7)
        ]
    assert newest(p, game)[0] == 6


def test_keep_last_refuses_the_duplicate_just_outside_the_window(
    table: TableClient, game: str
) -> None:
    messages = fill(table, "state", game, 6)
    make(table, "state").retain(game, keep_last=2)
    (outside,) = make(table, "state").process_batch(game, [messages[3]])
    assert outside.status == "abandoned"
    assert isinstance(outside.error, DuplicateOutsideWindowError)
    # Its id was removed with version 4: the write took it for new, found no
    # id row, and the window read says which record is gone, with the watermark.
    assert outside.error.reason == (
        "its stored version or the one before it was removed by retention"
    )
    assert outside.error.message_id == messages[3].id
    assert outside.error.sent_at is None
    assert isinstance(outside.error.watermark, datetime)
    assert str(outside.error) == (
        f"message {messages[3].id!r} for handler 'Tally' is outside the "
        "de-duplication window: its stored version or the one before it was removed by "
        f"retention (the retention watermark {outside.error.watermark.isoformat()}); "
        "it may be a duplicate whose record is gone"
    )
    assert newest(make(table, "state"), game)[0] == 6


# --- 7. poison messages --------------------------------------------------------------


def assert_only_the_middle_one_abandoned(outcomes: Sequence[Any], reason: str) -> None:
    assert [(o.status, o.version) for o in outcomes] == [
        ("completed", 1),
        ("abandoned", None),
        ("completed", 2),
    ]
    assert reason in str(outcomes[1].reason)


POISON = [
    ("state", "p", "Capture", "Captures"),
    ("outbox", "p", "Capture", "Captures"),
    ("outbox", "p", "Huge", "bytes"),
    ("state", "x" * 505, "Add", "1024"),
    ("outbox", "x" * 505, "Add", "1024"),
]


@pytest.mark.parametrize(
    ("strategy", "message_id", "type", "reason"),
    POISON,
    ids=[f"{s}-{t}-{len(i)}" for s, i, t, _ in POISON],
)
def test_a_poison_message_is_abandoned_alone(
    table: TableClient, game: str, strategy: StrategyName, message_id: str, type: str, reason: str
) -> None:
    # capture over 64 KiB, outbox outputs over 1 MiB, and an id row key over 1 KiB
    batch = [Message("a", game, "Add", {}), Message(message_id, game, type, {})]
    batch.append(Message("b", game, "Add", {}))
    p = make(table, strategy)

    outcomes = p.process_batch(game, batch)

    assert_only_the_middle_one_abandoned(outcomes, reason)
    assert newest(p, game) == (2, {"count": 2, "seen": ["a", "b"]})
    assert [e.id for e in Stream.read(p.store.partition(game)).events] == ["a", "b"]


# --- 8. output ids ---------------------------------------------------------------------


def test_the_same_message_id_on_two_keys_gives_different_output_ids(
    table: TableClient, strategy: StrategyName, game: str
) -> None:
    p = make(table, strategy)
    one = p.process(Message("m-1", game + "-a", "Add", {}))
    two = p.process(Message("m-1", game + "-b", "Add", {}))
    assert one.outputs[0].id != two.outputs[0].id
    assert p.process(Message("m-1", game + "-a", "Add", {})).status == "duplicate"


# --- 9. a clock that is not UTC ----------------------------------------------------


@handler("Stamp", None, types=["Stamp"])
def stamp(state: dict[str, Any], message: Message, ctx: HandlerContext) -> None:
    state["at"] = ctx.now().isoformat()
    ctx.publish("Stamped", {"at": ctx.now().isoformat()})


def test_a_clock_in_another_time_zone_gives_replays_the_same_instant(
    table: TableClient, game: str
) -> None:
    local = timezone(timedelta(hours=2))
    clock = lambda: datetime(2026, 5, 1, 14, 30, tzinfo=local)  # noqa: E731
    first = Processor(stamp, table, InMemoryPublisher(), clock=clock).process(
        Message("s1", game, "Stamp")
    )
    again = Processor(stamp, table, InMemoryPublisher(), clock=clock).process(
        Message("s1", game, "Stamp")
    )
    assert first.outputs[0].body == {"at": "2026-05-01T12:30:00+00:00"}
    assert (again.status, again.outputs) == ("duplicate", first.outputs)

    naive: Processor[dict[str, Any]] = Processor(
        stamp, table, InMemoryPublisher(), clock=lambda: datetime(2026, 5, 1)
    )
    with pytest.raises(ValueError, match="clock returned a naive datetime"):
        naive.process(Message("s2", game, "Stamp"))


def test_a_version_stored_before_ids_named_the_key_replays_with_its_own_ids(
    table: TableClient, game: str
) -> None:
    p = make(table, "state")
    message = Message("m-1", game, "Add", {})
    first = p.process(message)
    # Rewrite the stored version as the previous release wrote it: no IdScheme
    # column, and the digest of outputs whose ids were derived without the key.
    old = HandlerContext(message, handler="Tally", now=datetime(2026, 1, 1), id_scheme=1)
    tally.apply(Tally(), message, old)
    row_key = "Tally|SS-SE-0000000001"
    entity = table.get_entity(game, row_key)
    del entity["IdScheme"]
    entity["Digest"] = digest(pack([o.encode() for o in old.outputs]))
    table.update_entity(entity, mode=UpdateMode.REPLACE)

    publisher = InMemoryPublisher()
    again = make(table, "state", publisher).process(message)

    assert (again.status, again.version) == ("duplicate", 1)
    assert [o.id for o in again.outputs] == [o.id for o in old.outputs]
    assert [o.id for o in again.outputs] != [o.id for o in first.outputs]


# --- outputs the publisher could never deliver (robustness) ------------------------------


@handler("Emitter", None, types=["Emit"])
def emitter(state: dict[str, Any], message: Message, ctx: HandlerContext) -> None:
    spec = message.body
    state["n"] = state.get("n", 0) + 1
    for n in range(spec.get("count", 1)):
        ctx.publish(
            "Out",
            {"blob": "b" * spec.get("size", 1), "n": n},
            key=spec.get("key"),
            id=spec.get("id"),
        )


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ({"key": "bad/key"}, "output key 'bad/key' contains '/'"),
        ({"key": "k\x01"}, "contains '\\x01'"),
        ({"id": "x" * 600}, "the limit is 1024"),
        ({"size": 70_000}, "property 'Body' is 70014 bytes of binary; the limit is 65536"),
        ({"id": "same", "count": 2}, "two outputs have the id 'same' and different content"),
    ],
    ids=["slash-in-key", "control-in-key", "id-over-1KiB", "body-over-64KiB", "same-id-twice"],
)
def test_an_output_the_table_publisher_cannot_hold_abandons_its_message_alone(
    table: TableClient, strategy: StrategyName, game: str, spec: dict[str, Any], reason: str
) -> None:
    from handlers import TablePublisher

    p: Processor[dict[str, Any]] = Processor(
        emitter, table, TablePublisher(table), strategy=strategy
    )
    batch = [
        Message("a", game, "Emit", {"key": game + "-out"}),
        Message("bad", game, "Emit", spec),
        Message("b", game, "Emit", {"key": game + "-out"}),
    ]

    outcomes = p.process_batch(game, batch)

    assert_only_the_middle_one_abandoned(outcomes, reason)
    published = sorted(e["RowKey"] for e in table.query_entities(f"PartitionKey eq '{game}-out'"))
    assert published == sorted(o.outputs[0].id for o in (outcomes[0], outcomes[2]))


def test_the_table_publisher_splits_by_bytes_and_refuses_one_id_with_two_contents(
    table: TableClient, connection_string: str, game: str
) -> None:
    from handlers import TablePublisher
    from tests.faults import DelegatingTransport

    class Sizes(DelegatingTransport):
        def __init__(self) -> None:
            super().__init__()
            self.batches: list[int] = []

        def send(self, request: Any, **kwargs: Any) -> Any:
            if request.url.endswith("$batch"):
                self.batches.append(len(request.body or b""))
            return super().send(request, **kwargs)

    sizes = Sizes()
    publisher = TablePublisher(faulty_client(connection_string, table, sizes))
    outputs = [Message(f"o{n}", game, "Out", {"blob": "x" * 60_000}) for n in range(80)]

    publisher.publish(outputs)  # about 6.4 MB of rows with base64 bodies: two transactions

    assert len(sizes.batches) == 2
    assert max(sizes.batches) < 4 * 1024 * 1024
    assert len(list(table.query_entities(f"PartitionKey eq '{game}'"))) == 80
    with pytest.raises(ValueError, match="output id 'o1' comes twice with different content"):
        publisher.publish([outputs[1], Message("o1", game, "Other", {})])


# --- reading a key: the newest state, and its history ------------------------------


async def _aio_read(
    table: AsyncTableClient, key: str, page_size: int = 1000
) -> tuple[KeyState[Any], list[KeyVersion[Any]]]:
    now = await aio.current_state(tally, table, key)
    return now, [v async for v in aio.history(tally, table, key, page_size=page_size)]


def test_current_state_and_history_of_a_key(
    table: TableClient, async_table: AsyncTableClient, strategy: StrategyName, game: str
) -> None:
    p = make(table, strategy)
    assert (p.current_state(game).version, vars(p.current_state(game).state)) == (
        0,
        {"count": 0, "seen": []},
    )
    assert list(p.history(game)) == []
    assert wait(_aio_read(async_table, game)) == (p.current_state(game), [])
    p.process_batch(game, adds(game, ["a", "b", "c", "d", "e"]))
    # The async reads give the same answers.
    assert wait(_aio_read(async_table, game, 2)) == (p.current_state(game), list(p.history(game)))

    now = p.current_state(game)
    assert (now.key, now.version, vars(now.state)) == (
        game,
        5,
        {"count": 5, "seen": ["a", "b", "c", "d", "e"]},
    )
    found = [(v.version, v.message_id, v.message_type, v.state.count) for v in p.history(game)]
    assert found == [
        (1, "a", "Add", 1),
        (2, "b", "Add", 2),
        (3, "c", "Add", 3),
        (4, "d", "Add", 4),
        (5, "e", "Add", 5),
    ]
    assert all(v.now.tzinfo is not None for v in p.history(game))

    p.retain(game, keep_last=2)  # keeps 4 and 5 (and 3 under the state strategy)
    kept = [3, 4, 5] if strategy == "state" else [4, 5]
    # Pages of two from the first kept version: none is empty before the end.
    assert [v.version for v in p.history(game, page_size=2)] == kept
    assert p.current_state(game).version == 5
    after = wait(_aio_read(async_table, game, 2))
    assert (after[0].version, [v.version for v in after[1]]) == (5, kept)
    with pytest.raises(ValueError, match="page_size must be an int >= 1, got 0"):
        list(p.history(game, page_size=0))
    with pytest.raises(ValueError, match="page_size must be an int >= 1, got 0"):
        wait(_aio_read(async_table, game, 0))
