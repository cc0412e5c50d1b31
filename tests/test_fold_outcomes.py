"""The fold's decisions that only a redelivery, a new deploy or retention
reaches, against Azurite: each message's exact outcome (``stops_key``
included), the stored versions and what was published.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from azure.data.tables import TableClient

from handlers import (
    DuplicateOutsideWindowError,
    Handler,
    HandlerContext,
    InMemoryPublisher,
    Message,
    NonDeterministicHandlerError,
    Outcome,
    Processor,
    handler,
)
from streamstone_py import Stream
from tests.test_handlers_retention import fill


@handler("Ledger", types=["Add"])
def ledger(state: dict[str, Any], message: Message, ctx: HandlerContext) -> None:
    state["seen"] = [*state.get("seen", []), message.id]
    ctx.publish("Added", {"of": message.id})


@handler("Ledger", types=["Add"])
def ledger_redeployed(state: dict[str, Any], message: Message, ctx: HandlerContext) -> None:
    """``ledger`` after a deploy that adds a field to its output, and raises on
    a message it has applied already (``strict``) or on any (``refuse``)."""
    body = message.body or {}
    if body.get("refuse") or (body.get("strict") and message.id in state.get("seen", [])):
        raise ValueError(f"{message.id} is not for this deploy")
    state["seen"] = [*state.get("seen", []), message.id]
    ctx.publish("Added", {"of": message.id, "deploy": 2})


def nondeterministic(why: str) -> str:
    return (
        "handler 'Ledger' is not deterministic: message 'm1' handled again on the same "
        f"state produced different outputs ({why}); nothing was published"
    )


def stopped(message: Message, reason: str) -> Outcome:
    """The outcome of a message its key's earlier failure stopped."""
    why = f"an earlier message of key {message.key!r} failed: {reason}"
    return Outcome(message, "abandoned", None, (), why, stops_key=True, kind="stopped")


def stored_ids(p: Processor[Any], key: str) -> list[str | None]:
    return [e.id for e in Stream.read(p.store.partition(key)).events]


def test_a_duplicate_the_new_deploy_answers_differently_stops_its_key(
    table: TableClient, game: str
) -> None:
    # m1 is stored by the first deploy. Redelivered to the new one, it is
    # handled as new, the write finds it stored, and its replay publishes
    # other outputs: it fails, and m2 waits for it.
    Processor(ledger, table, InMemoryPublisher()).process(Message("m1", game, "Add"))
    publisher = InMemoryPublisher()
    m1, m2 = Message("m1", game, "Add"), Message("m2", game, "Add")

    outcomes = Processor(ledger_redeployed, table, publisher).process_batch(game, [m1, m2])

    reason = nondeterministic("output digest differs")
    assert outcomes == [
        Outcome(m1, "abandoned", None, (), reason, stops_key=True, kind="failed"),
        stopped(m2, reason),
    ]
    assert isinstance(outcomes[0].error, NonDeterministicHandlerError)
    assert stored_ids(Processor(ledger, table, publisher), game) == ["m1"]
    assert publisher.deliveries == []


@pytest.mark.parametrize(
    ("body", "replay"),
    [
        ({"strict": True}, "output digest differs"),
        ({"refuse": True}, "it raised ValueError('m1 is not for this deploy') this time"),
    ],
    ids=["replay-differs", "replay-raises"],
)
def test_a_stored_message_the_new_deploy_fails_on_is_abandoned_alone(
    table: TableClient, game: str, body: dict[str, Any], replay: str
) -> None:
    # The new deploy raises on m1 on the newest state. m1 is stored, so it is
    # replayed, which fails too: m1 is abandoned, and since the state holds it
    # already, m2 is handled on that state.
    m1, m2 = Message("m1", game, "Add", body), Message("m2", game, "Add")
    Processor(ledger, table, InMemoryPublisher()).process(m1)
    publisher = InMemoryPublisher()
    redeployed = Processor(ledger_redeployed, table, publisher)

    outcomes = redeployed.process_batch(game, [m1, m2])

    reason = nondeterministic(replay)
    assert [(o.status, o.reason) for o in outcomes] == [("abandoned", reason), ("completed", None)]
    (added,) = outcomes[1].outputs
    assert outcomes == [
        Outcome(m1, "abandoned", None, (), reason, stops_key=False, kind="failed"),
        Outcome(m2, "completed", 2, (added,)),
    ]
    assert isinstance(outcomes[0].error, NonDeterministicHandlerError)
    assert (added.type, added.body) == ("Added", {"of": "m2", "deploy": 2})
    assert publisher.deliveries == [added]
    current = redeployed.current_state(game)
    assert (current.version, current.state) == (2, {"seen": ["m1", "m2"]})


WATERMARK = datetime(2026, 1, 1, 0, 3, tzinfo=UTC)
NO_ZONE = "its sent_at header is not a time with a zone, and retention removed versions"
BEFORE = "it was sent before retention removed the versions of its time"


@pytest.mark.parametrize(
    ("sent_at", "reason", "read_as"),
    [
        ("2026-01-01T00:01:00", NO_ZONE, "2026-01-01T00:01:00"),
        ("New Year's Day", NO_ZONE, "New Year's Day"),
        ("2026-01-01T01:03:00+01:00", BEFORE, WATERMARK),  # the watermark itself, elsewhere
    ],
    ids=["no-zone", "not-a-time", "at-the-watermark"],
)
def test_a_late_message_whose_record_is_gone_is_refused_alone(
    table: TableClient, game: str, sent_at: str, reason: str, read_as: object
) -> None:
    p, messages = fill(table, "state", game, 6)  # processed at minutes 1 to 6
    p.retain(game, keep_last=2)  # removes versions 1 to 3: the watermark is minute 3
    kept = stored_ids(p, game)
    late = Message(messages[1].id, game, "FireAt", messages[1].body, {"sent_at": sent_at})
    # A duplicate whose record is kept is one, whatever its sent_at says.
    again = Message(messages[-1].id, game, "FireAt", messages[-1].body, {"sent_at": sent_at})
    fresh = Message("fresh", game, "FireAt", {"position": 9}, {"sent_at": "2026-01-01T01:00Z"})

    refused, duplicate, completed = p.process_batch(game, [late, again, fresh])

    error = refused.error
    assert isinstance(error, DuplicateOutsideWindowError)
    assert (error.handler, error.message_id, error.reason) == ("ShootingRange", late.id, reason)
    assert (error.sent_at, error.watermark) == (read_as, WATERMARK)
    assert refused == Outcome(late, "abandoned", None, (), str(error), kind="refused")
    assert refused.stops_key is False
    assert (duplicate.status, duplicate.version) == ("duplicate", 6)
    assert (completed.status, completed.version) == ("completed", 7)
    assert stored_ids(p, game) == [*kept, "fresh"]


@handler("Repeater", types=["Say"])
def repeater(state: dict[str, Any], message: Message, ctx: HandlerContext) -> None:
    state["said"] = state.get("said", 0) + 1
    said = message.body.get("id", f"{message.id}-said")
    for _ in range(2):  # the same output twice: one id, one content
        ctx.publish("Said", {"text": message.body["text"]}, id=said)


def test_a_handler_that_publishes_one_output_twice_is_processed(
    table: TableClient, game: str
) -> None:
    publisher = InMemoryPublisher()
    p = Processor(repeater, table, publisher)
    message = Message("hello", game, "Say", {"text": "hi"})

    # The message, and a copy of it in the same batch.
    outcome, copy = p.process_batch(game, [message, message])

    assert (outcome.status, outcome.reason, len(outcome.outputs)) == ("completed", None, 2)
    said = outcome.outputs[0]
    assert (said.id, said.type, said.body) == ("hello-said", "Said", {"text": "hi"})
    assert outcome == Outcome(message, "completed", 1, (said, said))
    assert copy == Outcome(message, "duplicate", 1, (said, said))
    assert publisher.deliveries == [said, said, said, said]
    assert p.current_state(game).state == {"said": 1}


def test_an_output_id_an_earlier_message_published_otherwise_is_refused_alone(
    table: TableClient, game: str
) -> None:
    # Both publish the output id "greeting": the second with other content.
    publisher = InMemoryPublisher()
    p = Processor(repeater, table, publisher)
    first = Message("hello", game, "Say", {"text": "hi", "id": "greeting"})
    second = Message("again", game, "Say", {"text": "ho", "id": "greeting"})
    later = Message("later", game, "Say", {"text": "hm"})

    done, refused, after = p.process_batch(game, [first, second, later])

    reason = (
        "output id 'greeting' of message 'again' was published by message 'hello' with other "
        "content"
    )
    assert (done.status, after.status) == ("completed", "completed")
    assert refused == Outcome(second, "abandoned", None, (), reason, kind="refused")
    assert [o.body for o in publisher.deliveries] == [{"text": "hi"}] * 2 + [{"text": "hm"}] * 2
    assert p.current_state(game).state == {"said": 2}


@handler("Tokens", types=["Issue"])
def tokens(state: dict[str, Any], message: Message, ctx: HandlerContext) -> None:
    token = ctx.capture("token", lambda: uuid.uuid4().hex)  # a value no replay can compute
    state["issued"] = [*state.get("issued", []), token]
    ctx.publish("Issued", {"token": token})


def test_a_duplicate_is_replayed_with_the_values_its_original_captured(
    table: TableClient, game: str
) -> None:
    p = Processor(tokens, table, InMemoryPublisher())
    message = Message("t-1", game, "Issue")
    first = p.process(message)

    again = p.process(message)

    (issued,) = first.outputs
    assert again == Outcome(message, "duplicate", 1, (issued,))
    assert p.current_state(game).state == {"issued": [issued.body["token"]]}


def test_a_duplicate_whose_state_before_it_is_gone_is_refused_alone(
    table: TableClient, game: str
) -> None:
    p, messages = fill(table, "state", game, 6)
    p.retain(game, keep_last=2)  # keeps versions 4 to 6: version 4 is kept as a state only
    kept = stored_ids(p, game)
    fresh = Message("fresh", game, "FireAt", {"position": 9})

    refused, completed = p.process_batch(game, [messages[3], fresh])

    error = refused.error
    assert isinstance(error, DuplicateOutsideWindowError)
    assert (error.message_id, error.reason) == (
        messages[3].id,
        "its stored version or the one before it was removed by retention",
    )
    assert refused == Outcome(messages[3], "abandoned", None, (), str(error), kind="refused")
    assert (completed.status, completed.version) == ("completed", 7)
    assert stored_ids(p, game) == [*kept, "fresh"]


class Opening(Handler[dict[str, Any]]):
    """``ledger_redeployed`` with a bug in its initial state: a deploy that reads
    an opening balance it no longer has. A key's first version is replayed on
    the initial state, so only a replay of it calls ``initial_state``."""

    name = "Ledger"
    message_types = frozenset({"Add"})

    def handle(self, state: dict[str, Any], message: Message, ctx: HandlerContext) -> None:
        ledger_redeployed.handle(state, message, ctx)

    def initial_state(self) -> dict[str, Any]:
        raise LookupError("no opening balance configured")


def test_a_stored_message_whose_replay_cannot_be_attempted_stops_its_key(
    table: TableClient, game: str
) -> None:
    # m1 is stored; the new deploy raises on it, and replaying it needs the
    # initial state, which raises too (not a handler error): whether m1 is
    # stored cannot be told, so m1 fails with both reasons and m2 waits.
    m1, m2 = Message("m1", game, "Add", {"refuse": True}), Message("m2", game, "Add")
    Processor(ledger, table, InMemoryPublisher()).process(m1)
    publisher = InMemoryPublisher()

    outcomes = Processor(Opening(), table, publisher).process_batch(game, [m1, m2])

    reason = outcomes[0].reason or ""
    failed, looked_up = reason.split("; and ")
    assert failed.startswith(
        "handler 'Ledger' failed on message 'm1': ValueError: m1 is not for this deploy (at "
    )
    assert looked_up == (
        "whether message 'm1' is stored cannot be told: LookupError: no opening balance configured"
    )
    assert outcomes == [
        Outcome(m1, "abandoned", None, (), reason, stops_key=True, kind="failed"),
        stopped(m2, reason),
    ]
    assert stored_ids(Processor(ledger, table, publisher), game) == ["m1"]
    assert publisher.deliveries == []
