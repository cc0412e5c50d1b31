"""Attacks on the tokens' guarantee (issue 44's adversarial review), each on
real tables: a sender's copy that meets a retention in progress, and what
an interrupted ``retain`` leaves behind."""

from __future__ import annotations

from typing import Any

import pytest
from azure.data.tables import TableClient

from handlers import InMemoryPublisher, Message, Processor
from handlers._store import TOKEN_HEADER
from handlers.examples import accounts
from tests.tokening import (
    Crash,
    H,
    credits,
    expected_stream,
    stream_rows,
    token_of,
    token_rows,
    with_rows,
)


def _credited_and_retained(table: TableClient, a: str, b: str) -> tuple[Processor[Any], Message]:
    """A sent B a credit of 30 with tokens, B applied it, and B's retention
    removed the credit's version (keep_last=1 after two deposits)."""
    publisher = InMemoryPublisher()
    p = Processor(accounts, table, publisher, tokens=True)
    p.process(Message("dep-a", a, "Deposit", {"amount": 100}))
    p.process(Message("t-1", a, "Transfer", {"to": b, "amount": 30}))
    [credit] = credits(publisher.deliveries)
    assert p.process(credit).status == "completed"
    p.process(Message("dep-b1", b, "Deposit", {"amount": 1}))
    p.process(Message("dep-b2", b, "Deposit", {"amount": 1}))
    assert p.retain(b, keep_last=1) == 1
    p.process(Message("dep-a2", a, "Deposit", {"amount": 1}))
    return p, credit


def _retain_dying(
    monkeypatch: pytest.MonkeyPatch, p: Processor[Any], key: str, owner: object, step: str
) -> None:
    """``retain(key, keep_last=0)``, the worker dying as it calls ``owner.step``."""

    def dies(*_: object) -> None:
        raise Crash(step)

    with monkeypatch.context() as m:
        m.setattr(owner, step, dies)
        with pytest.raises(Crash):
            p.retain(key, keep_last=0)


def test_a_sender_copy_after_an_interrupted_retain_sends_the_recorded_token(
    table: TableClient, game: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's retention dies after it removed the transfer's checkpoint and
    before it removed the transfer's version: a copy of the transfer is then
    still a duplicate (its version is stored), finds no checkpoint, and must
    not mint a new token: B's credit was applied, its version is gone, and a
    credit under a fresh token would be applied again."""
    a, b = f"{game}-a", f"{game}-b"
    p, credit = _credited_and_retained(table, a, b)
    _retain_dying(monkeypatch, p, a, p.store, "truncate")
    again = p.process(Message("t-1", a, "Transfer", {"to": b, "amount": 30}))
    assert again.status == "duplicate"
    resent = credits(again.outputs)
    for copy in resent:
        p.process(copy)
    assert p.current_state(b).state.balance == 32
    assert [token_of(c) for c in resent] in ([], [token_of(credit)])
    assert p.current_state(a).state.balance == 71
    assert token_rows(table, b) == {}
    p.retain(a, keep_last=0)  # finishes the interrupted cut
    assert stream_rows(table, a) == expected_stream(table, a, [])
    assert token_rows(table, a) == {}
    assert f"{H}|TK-{token_of(credit)}" not in token_rows(table, b)


@pytest.mark.parametrize("runner", ["wire", "sdk"])
def test_a_sender_copy_that_stalls_while_retention_runs_sends_no_new_token(
    table: TableClient, sdk_table: TableClient, game: str, monkeypatch: pytest.MonkeyPatch,
    runner: str,
) -> None:  # fmt: skip
    """A copy of the transfer finds its version stored (a duplicate), then
    stalls before it reads the checkpoint; meanwhile A's retention removes
    the transfer's version and its checkpoint, as it may once the credit went
    out. The copy must not send the credit again under a fresh token (on
    both runners: the checkpoint's insert carries a merge of keys alone)."""
    table = table if runner == "wire" else sdk_table
    a, b = f"{game}-a", f"{game}-b"
    p, credit = _credited_and_retained(table, a, b)
    tokens = p._tokens
    assert tokens is not None
    read = tokens.rows.checkpoint

    def stalls(*args: Any) -> Any:
        assert p.retain(a, keep_last=0) == 3  # while the copy waits
        return read(*args)

    monkeypatch.setattr(tokens.rows, "checkpoint", stalls)
    sent = len(p.publisher.deliveries)  # type: ignore[attr-defined]
    again = p.process(Message("t-1", a, "Transfer", {"to": b, "amount": 30}))
    monkeypatch.undo()
    resent = credits(p.publisher.deliveries[sent:])  # type: ignore[attr-defined]
    for copy in resent:
        p.process(copy)
    assert p.current_state(b).state.balance == 32
    assert p.current_state(a).state.balance == 71
    assert [token_of(c) for c in resent] in ([], [token_of(credit)])
    # The copy stops before any output (its version is gone: a redelivery is
    # a message from outside, judged by the window), leaving no token behind.
    assert (again.status, resent) == ("faulted", [])
    assert "removed with its version by retention" in str(again.reason)
    assert token_rows(table, b) == token_rows(table, a) == {}


def test_a_checkpoint_left_by_a_retain_interrupted_after_the_versions_goes_with_the_next_cut(
    table: TableClient, game: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = f"{game}-a", f"{game}-b"
    p, credit = _credited_and_retained(table, a, b)
    tokens = p._tokens
    assert tokens is not None
    _retain_dying(monkeypatch, p, a, tokens.rows, "sweep")  # after the versions
    assert stream_rows(table, a) == expected_stream(table, a, [])
    assert token_rows(table, a) == {
        f"{H}|TC-t-1": {"Tokens": [token_of(credit)], "Dispatched": True, "Retained": 4}
    }
    p.process(Message("t-2", a, "Transfer", {"to": b, "amount": 1}))
    p.process(Message("dep-a3", a, "Deposit", {"amount": 1}))
    assert p.retain(a, keep_last=0) == 2
    assert stream_rows(table, a) == expected_stream(table, a, [])
    assert token_rows(table, a) == {}
    assert p.current_state(a).state.balance == 71


def test_a_credit_applied_by_a_worker_with_tokens_still_off_is_not_applied_again(
    table: TableClient, game: str
) -> None:
    """Tokens turned on worker by worker: the sender's worker has them, the
    credit is taken by a worker that has not been restarted yet, retention
    removes the credit's version at once (as tokens allow), and the queue
    delivers the credit again, to a worker with tokens on."""
    a, b = f"{game}-a", f"{game}-b"
    publisher = InMemoryPublisher()
    on = Processor(accounts, table, publisher, tokens=True)
    off = Processor(accounts, table, publisher)
    on.process(Message("t-1", a, "Transfer", {"to": b, "amount": 30}))
    [credit] = credits(publisher.deliveries)
    assert off.process(credit).status == "completed"
    on.process(Message("dep-b1", b, "Deposit", {"amount": 1}))
    on.process(Message("dep-b2", b, "Deposit", {"amount": 1}))
    assert on.retain(b, keep_last=1) == 1
    on.process(credit)
    assert on.current_state(b).state.balance == 32


@pytest.mark.parametrize("first", ["stores and sends", "dies after registering"])
def test_a_transfer_applied_again_after_an_interrupted_retain_moves_the_money_whole(
    table: TableClient, game: str, monkeypatch: pytest.MonkeyPatch, first: str
) -> None:
    """The window's case: a copy of a transfer from outside that comes once
    its version is gone is applied again. Its credit must go with it under a
    token of its own, not under the consumed one of a checkpoint that an
    interrupted retain left (the money would leave A and reach no one):
    whether the copy that stores it again sends it, or dies and a duplicate
    of it does (which reads that checkpoint first)."""
    a, b = f"{game}-a", f"{game}-b"
    p, credit = _credited_and_retained(table, a, b)
    tokens = p._tokens
    assert tokens is not None
    _retain_dying(monkeypatch, p, a, tokens.rows, "sweep")  # after the versions
    p.process(Message("dep-a4", a, "Deposit", {"amount": 1}))
    transfer = Message("t-1", a, "Transfer", {"to": b, "amount": 30})
    if first == "dies after registering":
        dying = Processor(accounts, table, InMemoryPublisher(), tokens=True)
        with_rows(dying, "after register")
        with pytest.raises(Crash):
            dying.process(transfer)
    sent = len(p.publisher.deliveries)  # type: ignore[attr-defined]
    again = p.process(transfer)  # forgotten: the window's case, applied again
    assert again.status == ("completed" if first == "stores and sends" else "duplicate")
    [resent] = credits(p.publisher.deliveries[sent:])  # type: ignore[attr-defined]
    assert token_of(resent) != token_of(credit)
    assert p.process(resent).status == "completed"
    assert p.current_state(a).state.balance == 42
    assert p.current_state(b).state.balance == 62


def test_a_worker_with_tokens_off_finishes_what_a_version_stored_with_them_promised(
    table: TableClient, game: str
) -> None:
    """Tokens turned off worker by worker: a transfer stored with tokens by a
    worker that died before sending, delivered again to a worker with tokens
    off, goes out with a token (its version counts on one), and a copy of the
    credit after retention is dropped; the off worker's new transfers carry none."""
    a, b = f"{game}-a", f"{game}-b"
    dying = Processor(accounts, table, InMemoryPublisher(), tokens=True)
    with_rows(dying, "after register")
    transfer = Message("t-1", a, "Transfer", {"to": b, "amount": 30})
    with pytest.raises(Crash):
        dying.process(transfer)
    publisher = InMemoryPublisher()
    off = Processor(accounts, table, publisher)
    assert off.process(transfer).status == "duplicate"
    [credit] = credits(publisher.deliveries)
    assert len(token_of(credit)) == 32
    assert off.process(credit).status == "completed"
    off.process(Message("dep-b1", b, "Deposit", {"amount": 1}))
    off.process(Message("dep-b2", b, "Deposit", {"amount": 1}))
    assert off.retain(b, keep_last=1) == 1
    late = off.process(credit)
    assert (late.status, late.kind) == ("duplicate", "consumed")
    assert off.current_state(b).state.balance == 32
    off.process(Message("t-2", a, "Transfer", {"to": b, "amount": 5}))
    assert [TOKEN_HEADER in m.headers for m in credits(publisher.deliveries)] == [True, False]
