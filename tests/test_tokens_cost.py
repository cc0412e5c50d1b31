"""What tokens cost, in requests counted at the SDK's transport: the sender
pays 4 more for a message with one output to another key (register, create,
checkpoint, finish), the receiver none (the token's removal rides in its
write)."""

from __future__ import annotations

from azure.data.tables import TableClient

from handlers import HeaderCache, InMemoryPublisher, Message, Processor
from handlers.examples import accounts
from tests.test_handlers_cache import counted
from tests.tokening import credits


def test_requests_per_key_to_key_message_with_and_without_tokens(
    connection_string: str, table: TableClient, game: str
) -> None:
    client, plan = counted(connection_string, table)
    spent = {}
    for tokens in (True, False):
        a, b = f"{game}-a{tokens}", f"{game}-b{tokens}"
        publisher = InMemoryPublisher()
        p = Processor(accounts, client, publisher, tokens=tokens, cache=HeaderCache())
        p.process(Message("dep-a", a, "Deposit", {"amount": 100}))
        p.process(Message("dep-b", b, "Deposit", {"amount": 1}))
        before = plan.requests
        assert p.process(Message("t-1", a, "Transfer", {"to": b, "amount": 30})).kind == "completed"
        sender = plan.requests - before
        [credit] = credits(publisher.deliveries)
        before = plan.requests
        assert p.process(credit).kind == "completed"
        spent[tokens] = (sender, plan.requests - before)
        assert p.current_state(b).state.balance == 31
    assert spent == {True: (5, 1), False: (1, 1)}
