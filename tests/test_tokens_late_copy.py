"""A copy that comes after retention removed its version: with tokens it
changes nothing, however late; without, it is applied again (both measured,
on real tables, with the rows exactly as they end)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from azure.data.tables import TableClient

from handlers import HandlerContext, InMemoryPublisher, Message, Processor, handler
from handlers._outcome import CONSUMED
from handlers.examples import accounts, shooting_range
from tests.tokening import Crash, H, credits, expected_stream, stream_rows, token_of, token_rows


@pytest.mark.parametrize("tokens", [True, False], ids=["tokens", "no-tokens"])
def test_a_credit_delivered_again_a_month_after_retention(
    table: TableClient, game: str, tokens: bool
) -> None:
    a, b = f"{game}-a", f"{game}-b"
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    publisher = InMemoryPublisher()
    p = Processor(accounts, table, publisher, tokens=tokens, clock=lambda: now[0])
    p.process(Message("dep-a", a, "Deposit", {"amount": 100}))
    p.process(Message("t-1", a, "Transfer", {"to": b, "amount": 30}))
    [credit] = credits(publisher.deliveries)
    assert p.process(credit).status == "completed"
    p.process(Message("dep-b1", b, "Deposit", {"amount": 1}))
    p.process(Message("dep-b2", b, "Deposit", {"amount": 1}))
    # keep_last=1 keeps version 3 and the one before it: the credit's version 1 goes.
    assert p.retain(b, keep_last=1) == 1

    now[0] += timedelta(days=30)  # no sent_at: no window can tell the copy is old
    again = p.process(credit)

    balance = p.current_state(b).state.balance
    if tokens:
        assert (again.status, again.kind, again.reason, again.outputs) == (
            "duplicate", "consumed", CONSUMED, ()
        )  # fmt: skip
        assert balance == 32
        assert stream_rows(table, b) == expected_stream(table, b, [(2, "dep-b1"), (3, "dep-b2")])
        assert token_rows(table, b) == {}  # the token went with the credit's first version
        assert token_rows(table, a) == {
            f"{H}|TC-t-1": {"Tokens": [token_of(credit)], "Dispatched": True}
        }
    else:
        assert (again.status, again.kind) == ("completed", "completed")
        assert balance == 62  # the credit applied twice: 30 out of nothing
        assert stream_rows(table, b) == expected_stream(
            table, b, [(2, "dep-b1"), (3, "dep-b2"), (4, credit.id)]
        )
        assert token_rows(table, b) == token_rows(table, a) == {}
        assert "ss-token" not in credit.headers
    assert p.current_state(a).state.balance == 70
    assert publisher.divergent == []


def test_a_copy_whose_version_is_kept_only_as_the_base_of_the_newest_is_consumed(
    table: TableClient, game: str
) -> None:
    """keep_last=1 keeps the newest version and the one before it, on which
    a copy of the newest is replayed. A copy of that older one is found
    stored but cannot be replayed (its own predecessor is gone): with its
    token gone, it is a duplicate dropped as consumed, not refused (a refused
    message goes to the poison shelf). Found by benchmarks/bench_tokens.py,
    which delivers every credit again after the cut."""
    a, b = f"{game}-a", f"{game}-b"
    publisher = InMemoryPublisher()
    p = Processor(accounts, table, publisher, tokens=True)
    p.process(Message("dep-b1", b, "Deposit", {"amount": 1}))
    p.process(Message("dep-b2", b, "Deposit", {"amount": 1}))
    p.process(Message("t-1", a, "Transfer", {"to": b, "amount": 30}))
    [credit] = credits(publisher.deliveries)
    assert p.process(credit).version == 3
    p.process(Message("dep-b3", b, "Deposit", {"amount": 1}))
    assert p.retain(b, keep_last=1) == 2  # versions 3 (the credit's) and 4 stay
    delivered = len(publisher.deliveries)

    again = p.process(credit)

    assert (again.status, again.kind, again.reason, again.outputs) == (
        "duplicate", "consumed", CONSUMED, ()
    )  # fmt: skip
    assert p.current_state(b).state.balance == 33
    assert stream_rows(table, b) == expected_stream(table, b, [(3, credit.id), (4, "dep-b3")])
    assert token_rows(table, b) == {}
    assert len(publisher.deliveries) == delivered


def test_the_sender_keeps_its_version_until_the_outputs_went_out(
    table: TableClient, game: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention holds a version whose outputs' tokens were not dispatched,
    and the one before it; once they went out, both go, with the checkpoint."""
    a, b = f"{game}-a", f"{game}-b"
    publisher = InMemoryPublisher()
    p = Processor(accounts, table, publisher, tokens=True)
    p.process(Message("dep-a", a, "Deposit", {"amount": 100}))
    # The transfer is stored, and the worker dies before its tokens' first step.
    crashing = Processor(accounts, table, publisher, tokens=True)
    tokens = crashing._tokens
    assert tokens is not None

    def dies(*_: object) -> None:
        raise Crash("after state")

    monkeypatch.setattr(tokens, "before_dispatch", dies)
    with pytest.raises(Crash):
        crashing.process(Message("t-1", a, "Transfer", {"to": b, "amount": 30}))
    p.process(Message("dep-a2", a, "Deposit", {"amount": 1}))
    assert p.retain(a, keep_last=0) == 0  # t-1 (version 2) and version 1 before it stay
    assert stream_rows(table, a) == expected_stream(
        table, a, [(1, "dep-a"), (2, "t-1"), (3, "dep-a2")]
    )
    redelivered = p.process(Message("t-1", a, "Transfer", {"to": b, "amount": 30}))
    assert redelivered.status == "duplicate"
    [credit] = credits(redelivered.outputs)
    assert token_rows(table, b) == {f"{H}|TK-{token_of(credit)}": {"MessageId": "t-1", "From": a}}
    assert p.retain(a, keep_last=0) == 3
    assert stream_rows(table, a) == expected_stream(table, a, [])
    assert token_rows(table, a) == {}  # the checkpoint went with its version
    assert p.process(credit).status == "completed"
    assert token_rows(table, b) == {}
    assert p.current_state(b).state.balance == 30


def test_consumed_tokens_in_a_batch_split_over_transactions_give_the_result_of_one_by_one(
    table: TableClient, game: str
) -> None:
    """Each credit writes 3 operations (event, id, token): 33 fill a
    transaction. 21 of 60 were applied before and their versions removed: each
    write that meets one fails whole (the first transaction) or after the
    first committed (the second), its index names the consumed token, and the
    rest is written again without it, whatever the chunk size."""
    applied_before = {5, *range(40, 60)}
    results = []
    for max_batch in (500, 7):
        a, b = f"{game}-a{max_batch}", f"{game}-b{max_batch}"
        publisher = InMemoryPublisher()
        p = Processor(accounts, table, publisher, tokens=True, max_batch=max_batch)
        transfers = [Message(f"t-{n}", a, "Transfer", {"to": b, "amount": n}) for n in range(60)]
        p.process_batch(a, transfers)
        sent = credits(publisher.deliveries)
        assert len(sent) == 60
        assert len({token_of(c) for c in sent}) == 60
        early = [sent[n] for n in sorted(applied_before)]
        assert all(o.status == "completed" for o in p.process_batch(b, early))
        assert p.retain(b, keep_last=0) == 21
        deposit = Message("dep-b", b, "Deposit", {"amount": 1000})
        outcomes = p.process_batch(b, [*sent, deposit])
        assert [o.kind for o in outcomes] == [
            "consumed" if n in applied_before else "completed" for n in range(60)
        ] + ["completed"]
        assert p.current_state(b).state.balance == sum(range(60)) + 1000
        assert p.current_state(b).version == 21 + 39 + 1
        assert token_rows(table, b) == {}
        results.append([(o.message.body["amount"], o.kind, o.version) for o in outcomes])
    assert results[0] == results[1]


def test_tokens_need_the_state_strategy_and_named_types(table: TableClient) -> None:
    with pytest.raises(ValueError, match="tokens=True needs strategy='state'"):
        Processor(accounts, table, InMemoryPublisher(), tokens=True, strategy="outbox")
    assert Processor(shooting_range, table, InMemoryPublisher(), tokens=True).tokens

    @handler("Any")
    def anything(state: dict[str, int], message: Message, ctx: HandlerContext) -> None:
        pass

    with pytest.raises(ValueError, match="needs handler 'Any' to name its types"):
        Processor(anything, table, InMemoryPublisher(), tokens=True)
    with pytest.raises(ValueError, match="tokens must be True or False, got 1"):
        Processor(accounts, table, InMemoryPublisher(), tokens=1)  # type: ignore[arg-type]
