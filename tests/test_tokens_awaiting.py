"""Adversary round 3 on the checkpoint a token consumer's version awaits
its outputs with: chunked batches, copies in the batch, a failed publish."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import pytest
from azure.data.tables import TableClient

from handlers import HandlerContext, HeaderCache, InMemoryPublisher, Message, Processor, handler
from tests.test_tokens_compositions import Wallet, wallets
from tests.tokening import FailsOnce, token_rows


@dataclass
class WalletV2(Wallet):
    """Wallet, evolved: a field added with a default."""

    currency: str = "EUR"


@handler("Wallets", WalletV2, types=["Deposit", "Transfer", "Credit"])
def wallets_v2(state: WalletV2, message: Message, ctx: HandlerContext) -> None:
    wallets.handle(state, message, ctx)


class Fails(InMemoryPublisher):
    def publish(self, messages: Sequence[Message]) -> None:
        raise OSError("the queue is down")


def _credits(table: TableClient, a: str, b: str, n: int) -> list[Message]:
    sent = InMemoryPublisher()
    sender = Processor(wallets, table, sent, tokens=True)
    sender.process(Message(f"{a}-seed", a, "Deposit", {"amount": 10 * n}))
    sender.process_batch(
        a, [Message(f"{a}-t{i}", a, "Transfer", {"amount": 1, "to": b}) for i in range(n)]
    )
    return [m for m in sent.deliveries if m.type == "Credit"]


def _failed_credit(table: TableClient, game: str) -> tuple[str, Message]:
    """A credit to B, stored with its token consumed, whose notice failed to go out."""
    a, b = f"{game}-a", f"{game}-b"
    [credit] = _credits(table, a, b, 1)
    assert Processor(wallets, table, Fails(), tokens=True).process(credit).status == "faulted"
    return b, credit


@pytest.mark.parametrize("n", [30, 110])
def test_chunked_credits_with_a_copy_and_a_failed_publish(
    table: TableClient, game: str, n: int
) -> None:
    a, b = f"{game}-a", f"{game}-b"
    credits = _credits(table, a, b, n)
    deposits = [Message(f"{b}-d{i}", b, "Deposit", {"amount": 100}) for i in range(5)]
    batch = [*credits[:10], deposits[0], credits[0], *credits[10:], *deposits[1:]]
    failing = Processor(wallets, table, Fails(), tokens=True)
    failing.process_batch(b, batch)
    assert failing.current_state(b).state.balance == 500 + n
    awaiting = {f"Wallets|TC-{c.id}": {"Tokens": [], "Dispatched": False} for c in credits}
    assert token_rows(table, b) == awaiting
    assert failing.retain(b, keep_last=1) == 0
    out = InMemoryPublisher()
    receiver = Processor(wallets, table, out, tokens=True)
    receiver.process_batch(b, [*credits, credits[-1]])
    assert receiver.current_state(b).state.balance == 500 + n
    assert token_rows(table, b) == {}
    first = {m.id: m for m in out.deliveries}
    assert len(first) == n
    assert all(first[m.id] == m for m in out.deliveries)
    assert receiver.retain(b, keep_last=1) == n + 3  # the newest two stay
    late = receiver.process_batch(b, credits)
    assert {o.kind for o in late} == {"consumed"}
    assert receiver.current_state(b).state.balance == 500 + n
    assert token_rows(table, b) == {}
    Processor(wallets, table, InMemoryPublisher(), tokens=True).retain(a, keep_last=1)
    kept = {f"Wallets|TC-{a}-t{i}" for i in (n - 2, n - 1)}  # the newest two versions'
    assert set(token_rows(table, a)) == kept


@pytest.mark.parametrize("compression", [None, "zlib"])
def test_a_copy_through_the_header_cache_sends_the_awaited_notice(
    table: TableClient, game: str, compression: Literal["zlib"] | None
) -> None:
    a, b = f"{game}-a", f"{game}-b"
    [credit] = _credits(table, a, b, 1)
    out = FailsOnce()
    receiver = Processor(
        wallets, table, out, tokens=True, cache=HeaderCache(), compression=compression
    )
    assert receiver.process(credit).status == "faulted"
    assert token_rows(table, b) == {f"Wallets|TC-{credit.id}": {"Tokens": [], "Dispatched": False}}
    outcome = receiver.process(credit)  # the queue delivers it again, to the same worker
    notice = ("Credited", {"amount": 1, "balance": 1})
    assert (outcome.status, [(m.type, m.body) for m in out.deliveries]) == ("duplicate", [notice])
    assert token_rows(table, b) == {}
    assert receiver.current_state(b).state.balance == 1


@pytest.mark.parametrize("cached", [False, True])
def test_an_outbox_receiver_that_failed_to_publish_sends_after_retention(
    table: TableClient, game: str, cached: bool
) -> None:
    a, b = f"{game}-a", f"{game}-b"
    [credit] = _credits(table, a, b, 1)
    out = FailsOnce()
    cache = HeaderCache() if cached else None
    receiver = Processor(wallets, table, out, strategy="outbox", cache=cache)
    assert receiver.process(credit).status == "faulted"
    receiver.process(Message(f"{b}-d1", b, "Deposit", {"amount": 1}))
    receiver.process(Message(f"{b}-d2", b, "Deposit", {"amount": 1}))
    assert receiver.retain(b, keep_last=1) == 0  # its outbox row is not dispatched
    outcome = receiver.process(credit)
    notice = ("Credited", {"amount": 1, "balance": 1})
    assert (outcome.status, [(m.type, m.body) for m in out.deliveries]) == ("duplicate", [notice])
    assert receiver.retain(b, keep_last=1) == 2  # the outbox row answers the newest
    late = receiver.process(credit)
    assert (late.status, len(out.deliveries)) == ("duplicate", 1)
    assert receiver.current_state(b).state.balance == 3
    assert token_rows(table, b) == {f"Wallets|OB-{b}-d2": {"Dispatched": True}}  # kept version's


def test_a_copy_replayed_by_an_evolved_state_class_sends_the_awaited_notice(
    table: TableClient, game: str
) -> None:
    b, credit = _failed_credit(table, game)
    out = InMemoryPublisher()
    evolved = Processor(wallets_v2, table, out, tokens=True, cache=HeaderCache())
    evolved.process(Message(f"{b}-d", b, "Deposit", {"amount": 2}))
    assert evolved.retain(b, keep_last=0) == 0
    assert evolved.process(credit).status == "duplicate"
    assert [(m.type, m.body) for m in out.deliveries] == [("Credited", {"amount": 1, "balance": 1})]
    assert token_rows(table, b) == {}
    assert evolved.retain(b, keep_last=0) == 2
    assert evolved.process(credit).kind == "consumed"
    assert evolved.current_state(b).state == WalletV2(3, "EUR")


class Meets(InMemoryPublisher):
    """Two workers' publishers, each waiting at its publish for the other."""

    def __init__(self, barrier: threading.Barrier) -> None:
        super().__init__()
        self.barrier = barrier

    def publish(self, messages: Sequence[Message]) -> None:
        self.barrier.wait(timeout=20)
        super().publish(messages)


def test_two_workers_racing_on_copies_send_the_awaited_notice_alike(
    table: TableClient, game: str
) -> None:
    b, credit = _failed_credit(table, game)
    barrier = threading.Barrier(2)
    outs = [Meets(barrier), Meets(barrier)]
    workers = [Processor(wallets, table, out, tokens=True) for out in outs]
    with ThreadPoolExecutor(2) as pool:
        statuses = list(pool.map(lambda w: w.process(credit).status, workers))
    assert statuses == ["duplicate", "duplicate"]
    assert [(m.id, m.body) for m in outs[0].deliveries] == [
        (m.id, m.body) for m in outs[1].deliveries
    ]
    assert token_rows(table, b) == {}
    workers[0].process(Message(f"{b}-d", b, "Deposit", {"amount": 2}))
    assert workers[1].retain(b, keep_last=0) == 2
    assert [w.process(credit).kind for w in workers] == ["consumed", "consumed"]
    assert workers[0].current_state(b).state.balance == 3
    assert token_rows(table, b) == {}


def test_a_by_caller_consumer_waits_for_its_callers_mark(table: TableClient, game: str) -> None:
    """``dispatch="by_caller"`` outside Spark: the publish does not end the
    wait; the caller's mark of the consumer's id does (as its docstring says)."""
    a, b = f"{game}-a", f"{game}-b"
    [credit] = _credits(table, a, b, 1)
    out = InMemoryPublisher()
    caller = Processor(wallets, table, out, tokens=True, dispatch="by_caller")
    assert caller.process(credit).status == "completed"
    caller.process(Message(f"{b}-d", b, "Deposit", {"amount": 2}))
    assert token_rows(table, b) == {f"Wallets|TC-{credit.id}": {"Tokens": [], "Dispatched": False}}
    assert caller.retain(b, keep_last=0) == 0
    caller.mark_dispatched(b, [credit.id])
    assert (token_rows(table, b), caller.retain(b, keep_last=0)) == ({}, 2)
    assert caller.process(credit).kind == "consumed"
    assert [(m.type, m.body) for m in out.deliveries] == [("Credited", {"amount": 1, "balance": 1})]


def test_a_stale_header_cache_meets_credits_another_worker_stored_unpublished(
    table: TableClient, game: str
) -> None:
    a, b = f"{game}-a", f"{game}-b"
    credits = _credits(table, a, b, 30)
    out = InMemoryPublisher()
    stale = Processor(wallets, table, out, tokens=True, cache=HeaderCache(), max_batch=40)
    stale.process(Message(f"{b}-d", b, "Deposit", {"amount": 100}))  # cached at version 1
    Processor(wallets, table, Fails(), tokens=True).process_batch(b, credits[:10])
    outcomes = stale.process_batch(b, [*credits, credits[3]])
    assert [o.status for o in outcomes] == 10 * ["duplicate"] + 20 * ["completed"] + ["duplicate"]
    assert sorted(m.body["balance"] for m in out.deliveries) == sorted([*range(101, 131), 104])
    assert token_rows(table, b) == {}
    assert stale.retain(b, keep_last=0) == 31
    assert {o.kind for o in stale.process_batch(b, credits)} == {"consumed"}
    assert stale.current_state(b).state.balance == 130
