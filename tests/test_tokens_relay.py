"""Adversary round 3: a message that consumes a token and sends tokens of its
own (a relay), with a notice beside, whose publish fails after its write."""

from __future__ import annotations

from dataclasses import dataclass

from azure.data.tables import TableClient

from handlers import HandlerContext, HeaderCache, InMemoryPublisher, Message, Processor, handler
from tests.helpers import forked
from tests.test_tokens_compositions import Wallet, wallets
from tests.tokening import FailsOnce, token_rows


@handler("Wallets", Wallet, types=["Deposit", "Credit"])
def relays(state: Wallet, message: Message, ctx: HandlerContext) -> None:
    """A credit that names a next key passes half on, with a notice."""
    amount = message.body["amount"]
    state.balance += amount
    if message.body.get("next"):
        state.balance -= amount // 2
        ctx.publish("Credit", {"amount": amount // 2}, key=message.body["next"])
        ctx.publish("Credited", {"amount": amount, "balance": state.balance})


def test_a_relay_that_failed_to_publish_passes_on_once_after_retention(
    table: TableClient, game: str
) -> None:
    a, b, c = f"{game}-a", f"{game}-b", f"{game}-c"
    first = InMemoryPublisher()
    Processor(relays, table, first, tokens=True).process(
        Message(f"{a}-r", a, "Credit", {"amount": 40, "next": b})
    )
    [to_b] = [m for m in first.deliveries if m.type == "Credit"]
    to_b = Message(to_b.id, b, "Credit", {**to_b.body, "next": c}, headers=to_b.headers)
    out = FailsOnce()
    relay = Processor(relays, table, out, tokens=True)
    assert relay.process(to_b).status == "faulted"  # stored, token consumed, nothing out
    for i in range(3):
        relay.process(Message(f"{b}-d{i}", b, "Deposit", {"amount": 1}))
    assert relay.retain(b, keep_last=1) == 0
    assert relay.process(to_b).status == "duplicate"
    again = relay.process(to_b)
    assert again.status == "duplicate"
    sent = [(m.type, m.key, m.body) for m in out.deliveries]
    assert sent == 2 * [
        ("Credit", c, {"amount": 10}),
        ("Credited", b, {"amount": 20, "balance": 10}),
    ]
    credits_c = [m for m in out.deliveries if m.type == "Credit"]
    assert len({(m.id, m.headers["ss-token"]) for m in credits_c}) == 1
    receiver = Processor(relays, table, InMemoryPublisher(), tokens=True)
    for m in credits_c:
        receiver.process(m)
    assert receiver.current_state(c).state.balance == 10
    assert relay.retain(b, keep_last=1) == 2
    assert relay.process(to_b).kind == "consumed"
    assert receiver.current_state(b).state.balance == 13
    assert [k for k in token_rows(table, b) if "|TC-" not in k] == []
    assert token_rows(table, c) == {}


def test_a_forked_child_consumes_and_sends_tokens_with_the_parents_processor(
    table: TableClient, game: str
) -> None:
    """A prefork worker: the parent used the processor (its connections and
    thread pool exist), the child relays a credit and meets a copy."""
    a, b, c = f"{game}-a", f"{game}-b", f"{game}-c"
    out = InMemoryPublisher()
    worker = Processor(relays, table, out, tokens=True, cache=HeaderCache())
    worker.process(Message(f"{a}-r", a, "Credit", {"amount": 40, "next": b}))
    [to_b] = [m for m in out.deliveries if m.type == "Credit"]
    to_b = Message(to_b.id, b, "Credit", {**to_b.body, "next": c}, headers=to_b.headers)
    before = len(out.deliveries)

    def child() -> object:
        outcomes = [worker.process(to_b).status, worker.process(to_b).status]
        return [outcomes, [[m.type, m.key, m.body] for m in out.deliveries[before:]]]

    found = forked(child, within=30)
    sent = [["Credit", c, {"amount": 10}], ["Credited", b, {"amount": 20, "balance": 10}]]
    assert found == {"ok": [["completed", "duplicate"], 2 * sent]}
    assert worker.process(to_b).status == "duplicate"  # the parent, after the child
    assert worker.current_state(b).state.balance == 10
    assert list(token_rows(table, b)) == [f"Wallets|TC-{to_b.id}"]
    assert len(token_rows(table, c)) == 1  # the token the child's relay made for c


@dataclass
class Padded(Wallet):
    pad: str = ""


@handler("Padded", Padded, types=["Deposit", "Transfer", "Credit"])
def padded(state: Padded, message: Message, ctx: HandlerContext) -> None:
    """The wallets, each version storing a state of ~300 KiB: a batch is split by bytes."""
    wallets.handle(state, message, ctx)
    state.pad = f"{state.balance:07d}" * 45_000


def test_credits_whose_versions_fill_4_mib_await_their_notices(
    table: TableClient, game: str
) -> None:
    a, b = f"{game}-a", f"{game}-b"
    sent = InMemoryPublisher()
    sender = Processor(padded, table, sent, tokens=True)
    sender.process_batch(
        a, [Message(f"{a}-t{i}", a, "Transfer", {"amount": 1, "to": b}) for i in range(20)]
    )
    credits = [m for m in sent.deliveries if m.type == "Credit"]
    out = FailsOnce()
    receiver = Processor(padded, table, out, tokens=True)
    assert {o.status for o in receiver.process_batch(b, credits)} == {"faulted"}
    assert receiver.current_state(b).state.balance == 20
    assert set(token_rows(table, b)) == {f"Padded|TC-{c.id}" for c in credits}
    assert receiver.retain(b, keep_last=1) == 0
    assert {o.status for o in receiver.process_batch(b, credits)} == {"duplicate"}
    assert [m.body["balance"] for m in out.deliveries] == list(range(1, 21))
    assert token_rows(table, b) == {}
    assert receiver.retain(b, keep_last=1) == 18
    late = receiver.process_batch(b, credits)
    # The newest version is still answered by its id (and replayed on the one
    # before it, its notice again, identical); the others by their tokens.
    assert [o.kind for o in late] == 19 * ["consumed"] + ["duplicate"]
    assert [m.body["balance"] for m in out.deliveries] == [*range(1, 21), 20]
    assert len({(m.id, m.body["balance"]) for m in out.deliveries}) == 20
    assert receiver.current_state(b).state.balance == 20
