"""What tokens cost, in requests counted at the SDK's transport: the sender
pays 4 more for a message with one output to another key (register, create,
checkpoint, finish), the receiver none (the token's removal rides in its
write)."""

from __future__ import annotations

from azure.data.tables import TableClient

from handlers import HeaderCache, InMemoryPublisher, Message, Processor
from handlers.examples import accounts
from streamstone_py import Partition
from tests.helpers import rows as partition_rows
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


def test_rows_per_key_with_tokens_and_keep_last_1_against_a_window(
    table: TableClient, game: str
) -> None:
    """What a key stores once 30 transfers went from A to B: with tokens and
    keep_last=1 nothing but the newest versions (and the sender's checkpoints
    of those), without tokens and a window every version of its span."""
    rows: dict[bool, tuple[int, ...]] = {}
    for tokens in (True, False):
        a, b = f"{game}-a{tokens}", f"{game}-b{tokens}"
        publisher = InMemoryPublisher()
        p = Processor(accounts, table, publisher, tokens=tokens)
        for n in range(30):
            p.process(Message(f"t-{n}", a, "Transfer", {"to": b, "amount": 1}))
        for credit in credits(publisher.deliveries):
            p.process(credit)
        if tokens:  # the copies of everything are answered by tokens: cut to the newest
            assert (p.retain(a, keep_last=1), p.retain(b, keep_last=1)) == (28, 28)
        rows[tokens] = tuple(len(partition_rows(Partition(table, k))) for k in (a, b))
    # With tokens: header, 2 versions (event and id rows), 2 checkpoints; B: no token left.
    assert rows == {True: (7, 5), False: (61, 61)}
