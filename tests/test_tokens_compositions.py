"""Tokens composed with the rest of the runtime (the second adversary
round): a token message's receiver that has outputs of its own, chunking of
large batches of token messages, and the poison shelf's send-back."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from azure.data.tables import TableClient

from azurite.proxy import Action, Proxy, Request
from handlers import HandlerContext, InMemoryPublisher, Message, Processor, handler
from streamstone_py import WireTableClient
from tests.tokening import Crash, token_rows


@dataclass
class Wallet:
    balance: int = 0


@handler("Wallets", Wallet, types=["Deposit", "Transfer", "Credit"])
def wallets(state: Wallet, message: Message, ctx: HandlerContext) -> None:
    """The accounts, with a notice out of the system for every credit."""
    amount = message.body["amount"]
    if message.type == "Transfer":
        state.balance -= amount
        ctx.publish("Credit", {"amount": amount}, key=message.body["to"])
    else:
        state.balance += amount
    if message.type == "Credit":
        ctx.publish("Credited", {"amount": amount, "balance": state.balance})


class DiesPublishing(InMemoryPublisher):
    """The worker dies after the state is stored, before its outputs go out."""

    def publish(self, messages: Sequence[Message]) -> None:
        raise Crash("before publishing")


def _credit(publisher: InMemoryPublisher) -> Message:
    [credit] = [m for m in publisher.deliveries if m.type == "Credit"]
    return credit


def test_a_receiver_that_died_before_publishing_sends_its_outputs_after_retention(
    table: TableClient, game: str
) -> None:
    """B stores a credit (its token consumed) and dies before its notice goes
    out: retention keeps that version until a copy, replayed on it, sends
    the notice; then it may go, and a late copy is consumed."""
    a, b = f"{game}-a", f"{game}-b"
    sent = InMemoryPublisher()
    sender = Processor(wallets, table, sent, tokens=True)
    sender.process(Message("t-1", a, "Transfer", {"to": b, "amount": 30}))
    credit = _credit(sent)
    with pytest.raises(Crash):  # B's version is stored, its token consumed, nothing out
        Processor(wallets, table, DiesPublishing(), tokens=True).process(credit)
    assert token_rows(table, b) == {f"Wallets|TC-{credit.id}": {"Tokens": [], "Dispatched": False}}
    out = InMemoryPublisher()
    receiver = Processor(wallets, table, out, tokens=True)
    receiver.process(Message("d-1", b, "Deposit", {"amount": 1}))
    receiver.process(Message("d-2", b, "Deposit", {"amount": 1}))
    assert receiver.retain(b, keep_last=1) == 0  # its notice did not go out: kept
    outcome = receiver.process(credit)  # the queue delivers the credit again
    notice = ("Credited", {"amount": 30, "balance": 30})
    assert (outcome.status, [(m.type, m.body) for m in out.deliveries]) == ("duplicate", [notice])
    assert token_rows(table, b) == {}  # sent: the checkpoint goes, and the version may
    assert receiver.retain(b, keep_last=1) == 1
    late = receiver.process(credit)
    assert (late.status, late.kind, len(out.deliveries)) == ("duplicate", "consumed", 1)
    assert receiver.current_state(b).state.balance == 32
    assert token_rows(table, b) == {}


def _kinds(outcomes: Sequence[Any]) -> list[str]:
    return [o.kind for o in outcomes]


@pytest.mark.parametrize("max_batch", [500, 40])
def test_150_credits_to_one_key_apply_once_whatever_the_chunks(
    table: TableClient, game: str, max_batch: int
) -> None:
    a, b = f"{game}-a", f"{game}-b"
    sent = InMemoryPublisher()
    sender = Processor(wallets, table, sent, tokens=True, max_batch=max_batch)
    transfers = [Message(f"t-{i}", a, "Transfer", {"to": b, "amount": i}) for i in range(1, 151)]
    done = sender.process_batch(a, [Message("d-a", a, "Deposit", {"amount": 20_000}), *transfers])
    assert {o.kind for o in done} == {"completed"}
    credits = [m for m in sent.deliveries if m.type == "Credit"]
    assert [c.body["amount"] for c in credits] == list(range(1, 151))
    assert len(token_rows(table, b)) == 150
    receiver = Processor(wallets, table, InMemoryPublisher(), tokens=True, max_batch=max_batch)
    first = receiver.process_batch(b, credits[:50])
    receiver.process(Message("d-b", b, "Deposit", {"amount": 1}))
    receiver.retain(b, keep_last=0)  # the 50 credits' versions go: their tokens answer
    everything = receiver.process_batch(b, credits)
    again = receiver.process_batch(b, credits)
    assert _kinds(first) == ["completed"] * 50
    assert _kinds(everything) == ["consumed"] * 50 + ["completed"] * 100
    # The 51st's version is kept without the deposit's before it: not replayable.
    assert _kinds(again) == ["consumed"] * 51 + ["duplicate"] * 99
    assert receiver.current_state(b).state.balance == sum(range(1, 151)) + 1
    assert receiver.current_state(a).state.balance == 20_000 - sum(range(1, 151))
    assert token_rows(table, b) == {}
    sender.process(Message("d-a2", a, "Deposit", {"amount": 1}))
    sender.retain(a, keep_last=0)
    assert token_rows(table, a) == {}


@pytest.mark.parametrize("max_batch", [500, 40])
def test_150_transfers_to_150_keys_credit_each_once_whatever_the_chunks(
    table: TableClient, game: str, max_batch: int
) -> None:
    a = f"{game}-a"
    keys = [f"{game}-to-{i}" for i in range(150)]
    sent = InMemoryPublisher()
    sender = Processor(wallets, table, sent, tokens=True, max_batch=max_batch)
    transfers = [Message(f"t-{k}", a, "Transfer", {"to": k, "amount": 2}) for k in keys]
    sender.process_batch(a, transfers)
    again = sender.process_batch(a, transfers[:60])  # a redelivered part
    assert _kinds(again) == ["duplicate"] * 60
    credits = [m for m in sent.deliveries if m.type == "Credit"]
    assert len(credits) == 210
    assert len({c.headers["ss-token"] for c in credits}) == 150  # a duplicate re-sends its id
    receiver = Processor(wallets, table, InMemoryPublisher(), tokens=True)
    kinds = [receiver.process(c).kind for c in credits]
    assert kinds.count("completed") == 150
    assert [receiver.current_state(k).state.balance for k in keys] == [2] * 150
    assert all(token_rows(table, k) == {} for k in keys)
    sender.process(Message("d-a", a, "Deposit", {"amount": 300}))
    sender.retain(a, keep_last=0)
    assert receiver.current_state(a).state.balance == 0
    assert token_rows(table, a) == {}


@pytest.mark.parametrize("action", ["drop", "behead", "throttle"])
def test_a_lost_answer_amid_a_split_write_of_credits_applies_each_once(
    connection_string: str, table: TableClient, proxy: Proxy, game: str, action: Action
) -> None:
    """70 credits to one key: 3 transactions (33 token deletes each at most);
    the second's answer is lost or throttled, and resolved in the write."""
    a, b = f"{game}-a", f"{game}-b"
    sent = InMemoryPublisher()
    transfers = [Message(f"t-{i}", a, "Transfer", {"to": b, "amount": i}) for i in range(1, 71)]
    Processor(wallets, table, sent, tokens=True).process_batch(a, transfers)
    credits = [m for m in sent.deliveries if m.type == "Credit"]
    hits = itertools.count()

    def plan(request: Request) -> Action:
        if b"$batch" in request.head and b"TK-" in request.body and next(hits) == 1:
            return action
        return "pass"

    proxy.plan(plan)
    through = WireTableClient.from_connection_string(
        proxy.endpoint_of(connection_string), table.table_name
    )
    out = InMemoryPublisher()
    receiver = Processor(wallets, through, out, tokens=True)
    first = receiver.process_batch(b, credits)
    again = receiver.process_batch(b, credits)
    through.close()
    assert next(hits) > 2, "the second transaction was never seen"
    assert _kinds(first) == ["completed"] * 70
    assert _kinds(again) == ["duplicate"] * 70
    assert receiver.current_state(b).state.balance == sum(range(1, 71))
    balances = [m.body["balance"] for m in out.deliveries if m.type == "Credited"]
    running = [sum(range(1, i + 1)) for i in range(1, 71)]
    assert balances == running * 2
    assert token_rows(table, b) == {}
