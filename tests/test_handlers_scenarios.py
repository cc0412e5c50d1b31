"""The exactly-once scenarios, for the state-based and the outbox strategy alike."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from azure.data.tables import TableClient

from handlers import (
    InMemoryPublisher,
    Message,
    NonDeterministicHandlerError,
    Processor,
    StateTooLargeError,
    TablePublisher,
    handler,
)
from handlers._outcome import StrategyName
from handlers.examples import MAX_ATTEMPTS, LeaderBoard, leader_board, shooting_range
from streamstone_py import Stream

FIXED_TARGET = 42


def fire(game: str, n: int, position: int, player: str = "p1") -> Message:
    return Message(f"{game}-fire-{n}", game, "FireAt", {"position": position, "player": player})


def start(game: str, n: int) -> Message:
    return Message(f"{game}-round-{n}", game, "StartNewRound")


def processor(
    table: TableClient, strategy: StrategyName, publisher: Any = None, h: Any = shooting_range
) -> Processor[Any]:
    return Processor(h, table, publisher or InMemoryPublisher(), strategy=strategy)


def count_store_calls(p: Processor[Any]) -> list[str]:
    """Record, in order, the name of every storage call the processor makes from now on."""
    calls: list[str] = []
    for name in ("open", "find", "read", "write", "mark_dispatched", "outbox"):
        original = getattr(p.store, name)

        def counted(*args: Any, _name: str = name, _original: Any = original) -> Any:
            calls.append(_name)
            return _original(*args)

        setattr(p.store, name, counted)
    return calls


def target_of(p: Processor[Any], game: str) -> int:
    return int(p.load_state(game, "none").state.target_position)


def test_two_concurrent_copies_of_one_fire_at_give_one_hit(
    table: TableClient, strategy: StrategyName, game: str
) -> None:
    publisher = InMemoryPublisher()
    setup = processor(table, strategy, publisher)
    setup.process(start(game, 1))
    shot = fire(game, 1, target_of(setup, game))
    barrier = threading.Barrier(2)

    def deliver(_: int) -> Any:
        worker = processor(table, strategy, publisher)
        barrier.wait()
        return worker.process(shot)

    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(deliver, range(2)))

    assert sorted(o.status for o in outcomes) == ["completed", "duplicate"]
    hits = [m for m in publisher.messages.values() if m.type == "Hit"]
    assert len(hits) == 1
    assert hits[0].body["attempt_of"] == shot.id
    assert publisher.divergent == []
    state = setup.load_state(game, "none")
    assert state.version == 2  # one round, one shot: one state change
    assert state.state.number_of_attempts == 1
    if strategy == "state":  # the duplicate republished the very same message
        assert [m.id for m in publisher.deliveries if m.type == "Hit"] == [hits[0].id] * 2


def test_late_duplicate_after_the_target_moved_gives_the_first_output(
    table: TableClient, strategy: StrategyName, game: str
) -> None:
    publisher = InMemoryPublisher()
    p = processor(table, strategy, publisher)
    p.process(start(game, 1))
    first_shot = fire(game, 1, target_of(p, game))
    first = p.process(first_shot)
    for n in range(2, 2 + 2 * MAX_ATTEMPTS):  # the target moves several times
        p.process(fire(game, n, n))
    moved_to = target_of(p, game)

    late = p.process(first_shot)

    assert first.status == "completed"
    assert [(o.id, o.type, o.body) for o in first.outputs] == [
        (
            first.outputs[0].id,
            "Hit",
            {
                "game": game,
                "player": "p1",
                "position": first_shot.body["position"],
                "attempt_of": first_shot.id,
            },
        )
    ]
    assert late.status == "duplicate"
    if strategy == "state":
        assert [(o.id, o.type, o.body) for o in late.outputs] == [
            (o.id, o.type, o.body) for o in first.outputs
        ]
    else:  # dispatched already: the outbox neither re-runs the handler nor re-sends
        assert late.outputs == ()
    assert target_of(p, game) == moved_to
    assert p.load_state(game, "none").version == 2 + 2 * MAX_ATTEMPTS
    assert publisher.divergent == []


def test_duplicate_concurrent_mixes_of_fire_at_and_start_new_round(
    table: TableClient, strategy: StrategyName, game: str
) -> None:
    publisher = InMemoryPublisher()
    messages = [start(game, 1)] + [fire(game, n, n % 7) for n in range(1, 9)] + [start(game, 2)]
    messages += [fire(game, n, n % 5) for n in range(9, 15)]
    reference = processor(table, strategy, InMemoryPublisher())
    clean_game = game + "-clean"
    for m in messages:
        reference.process(Message(m.id, clean_game, m.type, m.body))

    # Four workers each get every message once or twice, in their own order of chunks.
    def work(worker: int) -> None:
        p = processor(table, strategy, publisher)
        for i in range(0, len(messages), 3):
            chunk = messages[i : i + 3]
            if (i // 3 + worker) % 2:
                chunk = chunk + chunk[:1]
            p.process_batch(game, chunk)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(work, range(4)))

    final = reference.load_state(game, "none")
    clean = reference.load_state(clean_game, "none")
    assert final.version == len(messages)
    assert final.state == clean.state
    # Each message changed state exactly once, in order: one event per message id.
    events = Stream.read(reference.store.partition(game)).events
    assert [e.id for e in events] == [m.id for m in messages]
    assert publisher.divergent == []
    assert len(list(publisher.messages.values())) == 14  # one output per FireAt


def test_downstream_duplicate_at_the_leader_board(
    table: TableClient, strategy: StrategyName, game: str
) -> None:
    hits = InMemoryPublisher()
    range_processor = processor(table, strategy, hits)
    range_processor.process(start(game, 1))
    target = target_of(range_processor, game)
    for n, position in enumerate([target, (target + 1) % 100, target], start=1):
        range_processor.process(fire(game, n, position, player=f"p{n}"))
    board = processor(table, strategy, InMemoryPublisher(), h=leader_board)
    outputs = list(hits.messages.values())

    first = board.process_batch(game, outputs)
    again = board.process_batch(game, outputs + outputs[:1])

    assert [o.status for o in first] == ["completed"] * len(outputs)
    assert [o.status for o in again] == ["duplicate"] * (len(outputs) + 1)
    state = board.load_state(game, "none").state
    assert isinstance(state, LeaderBoard)
    assert (state.hits, state.misses) == (
        sum(o.type == "Hit" for o in outputs),
        sum(o.type == "Missed" for o in outputs),
    )
    assert state.players == {m.body["player"]: 1 for m in outputs if m.type == "Hit"}


def test_batch_gives_the_same_states_and_outputs_as_one_by_one(
    table: TableClient, strategy: StrategyName, game: str
) -> None:
    messages = [start(game, 1)] + [fire(game, n, n % 3 * 40) for n in range(1, 12)]
    messages.insert(5, messages[3])  # a duplicate inside the batch
    one_by_one, batched = InMemoryPublisher(), InMemoryPublisher()
    a = processor(table, strategy, one_by_one)
    b = processor(table, strategy, batched)
    single = [a.process(Message(m.id, game + "-a", m.type, m.body)) for m in messages]
    batch = b.process_batch(
        game + "-b", [Message(m.id, game + "-b", m.type, m.body) for m in messages]
    )

    assert [o.status for o in single] == [o.status for o in batch]
    assert a.load_state(game + "-a", "x").state == b.load_state(game + "-b", "x").state

    # Output bodies name their game, and ids derive from it; the rest is equal.
    def strip(out: Any) -> list[tuple[str, Any]]:
        return [(m.type, {**m.body, "game": None}) for m in out]

    assert strip(one_by_one.deliveries) == strip(batched.deliveries)


def test_batch_costs_one_read_and_one_write(
    table: TableClient, strategy: StrategyName, game: str
) -> None:
    p = processor(table, strategy)
    calls = count_store_calls(p)
    p.process_batch(game, [start(game, 1)] + [fire(game, n, n) for n in range(1, 20)])
    expected = ["open", "write"] + (["mark_dispatched"] if strategy == "outbox" else [])
    assert calls == expected


def test_non_deterministic_handler_is_detected_and_publishes_nothing(
    table: TableClient, game: str
) -> None:
    import uuid as uuid_module

    @handler("Sloppy")
    def sloppy(state: dict[str, Any], message: Message, ctx: Any) -> None:
        ctx.publish("Done", {"token": str(uuid_module.uuid4())})  # not from the context
        state["n"] = state.get("n", 0) + 1

    publisher = InMemoryPublisher()
    p: Processor[dict[str, Any]] = Processor(sloppy, table, publisher)
    message = Message("m-1", game, "Do")
    p.process(message)
    delivered = list(publisher.deliveries)

    with pytest.raises(
        NonDeterministicHandlerError, match="'Sloppy' is not deterministic: message 'm-1'"
    ):
        p.process(message)

    assert publisher.deliveries == delivered
    # The outbox strategy replays stored outputs, so the same handler is fine there.
    outbox: Processor[dict[str, Any]] = Processor(sloppy, table, publisher, strategy="outbox")
    outbox.process(Message("m-1", game + "-o", "Do"))
    assert outbox.process(Message("m-1", game + "-o", "Do")).status == "duplicate"


def test_oversize_state_is_refused_with_a_clear_error(
    table: TableClient, strategy: StrategyName, game: str
) -> None:
    @handler("Hoarder")
    def hoarder(state: dict[str, Any], message: Message, ctx: Any) -> None:
        state["blob"] = b"x" * message.body["size"]

    p: Processor[dict[str, Any]] = Processor(hoarder, table, InMemoryPublisher(), strategy=strategy)
    fits = p.process(Message("m-1", game, "Grow", {"size": 900_000}))
    too_big = p.process(Message("m-2", game, "Grow", {"size": 1_000_001}))

    assert fits.status == "completed"
    assert too_big.status == "abandoned"
    assert isinstance(too_big.error, StateTooLargeError)
    assert "after message 'm-2' is 1000" in str(too_big.error)
    assert (too_big.error.handler, too_big.error.message_id) == ("Hoarder", "m-2")
    assert too_big.error.limit == 1_000_000 < too_big.error.size
    assert p.load_state(game, "x").version == 1


def test_handler_error_abandons_the_rest_of_the_key(
    table: TableClient, strategy: StrategyName, game: str
) -> None:
    @dataclass
    class Counter:
        n: int = 0

    @handler("Fragile", Counter)
    def fragile(state: Counter, message: Message, ctx: Any) -> None:
        if message.body == "boom":
            raise RuntimeError("cannot handle boom")
        state.n += 1

    p = Processor(fragile, table, InMemoryPublisher(), strategy=strategy)
    outcomes = p.process_batch(
        game, [Message(f"m{i}", game, "T", b) for i, b in enumerate(["ok", "boom", "ok"])]
    )

    assert [o.status for o in outcomes] == ["completed", "abandoned", "abandoned"]
    assert "RuntimeError: cannot handle boom" in (outcomes[1].reason or "")
    assert "an earlier message" in (outcomes[2].reason or "")
    assert p.load_state(game, "x").state == Counter(1)
    assert p.process_batch(game, [Message("m2", game, "T", "ok")])[0].status == "completed"


def test_unknown_types_are_abandoned_alone(
    table: TableClient, strategy: StrategyName, game: str
) -> None:
    p = processor(table, strategy)
    outcomes = p.process_batch(
        game, [start(game, 1), Message("x", game, "Teleport"), fire(game, 1, 5)]
    )
    assert [o.status for o in outcomes] == ["completed", "abandoned", "completed"]
    assert (outcomes[1].reason, outcomes[1].kind) == ("unknown type 'Teleport'", "refused")


def test_table_publisher_is_idempotent(table: TableClient, service: Any, game: str) -> None:
    sink_table = service.create_table_if_not_exists("outputs" + game.replace("-", "")[:20])
    sink = TablePublisher(sink_table)
    p = processor(table, "state", sink)
    messages = [start(game, 1)] + [fire(game, n, n) for n in range(1, 5)]
    p.process_batch(game, messages)
    first = sorted(
        (e["RowKey"], e["Type"])
        for e in sink_table.query_entities("PartitionKey eq @k", parameters={"k": game})
    )
    p.process_batch(game, messages)
    again = sorted(
        (e["RowKey"], e["Type"])
        for e in sink_table.query_entities("PartitionKey eq @k", parameters={"k": game})
    )
    assert len(first) == 4
    assert first == again


def test_a_message_that_changes_nothing_is_still_recorded(
    table: TableClient, strategy: StrategyName, game: str
) -> None:
    @handler("Observer")
    def observer(state: dict[str, Any], message: Message, ctx: Any) -> None:
        return None  # looks, changes nothing, publishes nothing

    p: Processor[dict[str, Any]] = Processor(
        observer, table, InMemoryPublisher(), strategy=strategy
    )
    assert p.process(Message("look-1", game, "Look")).status == "completed"
    assert p.load_state(game, "x").version == 1
    assert p.load_state(game, "look-1").is_duplicate
    assert p.process(Message("look-1", game, "Look")).status == "duplicate"


def test_load_state_makes_at_most_two_storage_calls(table: TableClient, game: str) -> None:
    p = processor(table, "state")
    p.process_batch(game, [start(game, 1)] + [fire(game, n, n) for n in range(1, 300)])
    calls = count_store_calls(p)
    # A new message: find its id, then open the header; a stored one: find it,
    # then read the state as of its version.
    expected = {
        "never-seen": (False, ["find", "open"]),
        f"{game}-fire-1": (True, ["find", "read"]),
        f"{game}-fire-150": (True, ["find", "read"]),
        f"{game}-fire-299": (True, ["find", "read"]),
    }
    for message_id, (duplicate, storage_calls) in expected.items():
        calls.clear()
        loaded = p.load_state(game, message_id)
        assert (loaded.is_duplicate, calls) == (duplicate, storage_calls), message_id


def test_a_message_id_the_table_cannot_store_is_abandoned_alone(
    table: TableClient, strategy: StrategyName, game: str
) -> None:
    p = processor(table, strategy)
    bad = Message("shot/with#bad?chars", game, "FireAt", {"position": 1})
    outcomes = p.process_batch(game, [start(game, 1), bad, fire(game, 2, 2)])
    assert [o.kind for o in outcomes] == ["completed", "refused", "completed"]  # bad: abandoned
    assert "message id cannot be stored: event id 'shot/with#bad?chars'" in str(outcomes[1].reason)
    assert p.load_state(game, "x").version == 2
    with pytest.raises(ValueError, match="partition key"):
        p.process_batch("bad/key", [Message("m", "bad/key", "FireAt", {"position": 1})])
