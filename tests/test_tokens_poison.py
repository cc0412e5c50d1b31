"""A token message through the poison shelf: a credit whose handler fails is
poisoned with its token unconsumed; sent back once the handler is fixed, it
is applied once; a second send-back, a sender's copy and a copy after the
receiver's retention change nothing."""

from __future__ import annotations

from datetime import timedelta

from azure.data.tables import TableClient
from azure.storage.queue import QueueClient, QueueServiceClient

from handlers import (
    HandlerContext,
    InMemoryPublisher,
    Message,
    Processor,
    QueueConsumer,
    QueuePublisher,
    handler,
    read_poison,
    send_back,
)
from tests.helpers import drain
from tests.test_tokens_compositions import Wallet, wallets
from tests.tokening import token_rows


@handler("Wallets", Wallet, types=["Deposit", "Transfer", "Credit"])
def broken(state: Wallet, message: Message, ctx: HandlerContext) -> None:
    if message.type == "Credit":
        raise RuntimeError("credits are broken today")
    wallets.handle(state, message, ctx)


def test_a_poisoned_credit_sent_back_twice_applies_once(
    table: TableClient, queues: QueueServiceClient, queue: QueueClient, game: str
) -> None:
    a, b = f"{game}-a", f"{game}-b"
    route = {"Credit": queue.queue_name}
    publisher = QueuePublisher(queues, route, default=f"{queue.queue_name}-out")
    sender = Processor(wallets, table, publisher, tokens=True)
    sender.process(Message("d-a", a, "Deposit", {"amount": 100}))
    transfer = Message("t-1", a, "Transfer", {"to": b, "amount": 30})
    sender.process(transfer)
    [text] = [m.content for m in queue.peek_messages(max_messages=32)]
    poison = queues.get_queue_client(f"{queue.queue_name}-poison")

    failing = Processor(broken, table, InMemoryPublisher(), tokens=True)
    shelved = QueueConsumer(failing, queue, max_dequeue_count=1, backoff=timedelta(0))
    assert shelved.run(until_empty=True).poisoned == 1
    [entry] = read_poison(poison)
    assert len(token_rows(table, b)) == 1  # unconsumed: the credit was never applied

    out = InMemoryPublisher()
    fixed = Processor(wallets, table, out, tokens=True)
    consumer = QueueConsumer(fixed, queue, backoff=timedelta(0))
    assert len(send_back(poison).sent) == 1
    first = consumer.run(until_empty=True)
    queue.send_message(entry.entry.content if entry.entry else text)  # a second send-back
    sender.process(transfer)  # and the sender's copy, with the same token
    second = consumer.run(until_empty=True)
    fixed.process(Message("d-b", b, "Deposit", {"amount": 1}))
    fixed.process(Message("d-b2", b, "Deposit", {"amount": 1}))
    assert fixed.retain(b, keep_last=1) == 1
    queue.send_message(text)  # a month later
    late = consumer.run(until_empty=True)

    assert (first.completed, second.duplicates, late.duplicates) == (1, 2, 1)
    assert (late.completed, late.poisoned, late.faulted) == (0, 0, 0)
    assert drain(queue) == []
    assert read_poison(poison) == []
    assert fixed.current_state(b).state.balance == 32
    notices = [m.body for m in out.deliveries if m.type == "Credited"]
    assert notices == [{"amount": 30, "balance": 30}] * 3  # the original, and 2 replays
    assert token_rows(table, b) == {}
    sender.process(Message("d-a2", a, "Deposit", {"amount": 1}))
    sender.retain(a, keep_last=0)
    assert token_rows(table, a) == {}
    assert fixed.current_state(a).state.balance == 71
