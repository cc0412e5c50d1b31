"""Tokens to another handler in its own states table (``token_receivers``):
the sender makes them there, the receiver's processor consumes them, a late
copy is dropped whatever retention removed, and a crashed attempt's tokens
are cleaned up in the receiver's table."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from azure.data.tables import TableClient, TableServiceClient

from handlers import (
    HandlerContext,
    InMemoryPublisher,
    Message,
    Processor,
    TokenReceiver,
    handler,
)
from handlers._batch._token_rows import TokenRows
from handlers._store import TOKEN_HEADER
from streamstone_py import Partition, WireTableClient, is_stream_row_key
from tests.helpers import register_raw, rows
from tests.tokening import Crash


@dataclass
class Orders:
    total: int = 0


@handler("Orders", Orders, types=["Order"])
def orders(state: Orders, message: Message, ctx: HandlerContext) -> None:
    state.total += message.body["amount"]
    ctx.publish("Invoice", {"amount": message.body["amount"]}, key=message.body["customer"])
    ctx.publish("Ordered", {"amount": message.body["amount"]})


@dataclass
class Billing:
    owed: int = 0


@handler("Billing", Billing, types=["Invoice"])
def billing(state: Billing, message: Message, ctx: HandlerContext) -> None:
    state.owed += message.body["amount"]


@pytest.fixture
def billing_table(service: TableServiceClient, connection_string: str) -> Iterator[TableClient]:
    name = "billing" + uuid.uuid4().hex[:10]
    register_raw(service.create_table(name))
    client = WireTableClient.from_connection_string(connection_string, name)
    yield client
    client.close()
    service.delete_table(name)


def _sender(table: TableClient, billing_table: TableClient) -> Processor[Any]:
    receivers = {"Invoice": TokenReceiver("Billing", billing_table)}
    return Processor(orders, table, InMemoryPublisher(), tokens=True, token_receivers=receivers)


def _beside_stream(table: TableClient, key: str) -> list[str]:
    return sorted(k for k in rows(Partition(table, key)) if not is_stream_row_key(k))


def test_a_late_copy_of_a_message_to_another_table_is_dropped(
    table: TableClient, billing_table: TableClient, game: str
) -> None:
    shop, customer = f"{game}-shop", f"{game}-c"
    sender = _sender(table, billing_table)
    sender.process(Message("o-1", shop, "Order", {"amount": 40, "customer": customer}))
    published = sender.publisher.deliveries  # type: ignore[attr-defined]
    [invoice] = [m for m in published if m.type == "Invoice"]
    [ordered] = [m for m in published if m.type == "Ordered"]
    header = invoice.headers[TOKEN_HEADER]
    assert header.startswith("Billing:")
    assert TOKEN_HEADER not in ordered.headers
    token = header.partition(":")[2]
    # The token waits in the receiver's table, the customer's partition.
    assert _beside_stream(billing_table, customer) == [f"Billing|TK-{token}"]
    receiver = Processor(billing, billing_table, InMemoryPublisher())  # tokens off: consumes
    assert receiver.process(invoice).status == "completed"
    assert _beside_stream(billing_table, customer) == []
    receiver.process(Message("i-2", customer, "Invoice", {"amount": 1}))
    receiver.process(Message("i-3", customer, "Invoice", {"amount": 1}))
    assert receiver.retain(customer, keep_last=1) == 1
    late = receiver.process(invoice)
    assert (late.status, late.kind) == ("duplicate", "consumed")
    assert receiver.current_state(customer).state.owed == 42
    # The sender's rows: its checkpoint alone, dispatched.
    assert _beside_stream(table, shop) == ["Orders|TC-o-1"]


def test_a_crashed_attempts_tokens_in_the_other_table_are_cleaned_up(
    table: TableClient, billing_table: TableClient, game: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first attempt dies after creating its token in the receiver's
    table; the copy's attempt makes its own, and deletes the first's there."""
    shop, customer = f"{game}-shop", f"{game}-c"
    order = Message("o-1", shop, "Order", {"amount": 40, "customer": customer})
    dying = _sender(table, billing_table)
    created = TokenRows.create

    def create_then_die(self: TokenRows, key: str, tokens: Any) -> None:
        created(self, key, tokens)
        raise Crash("after creating")

    with monkeypatch.context() as m:
        m.setattr(TokenRows, "create", create_then_die)
        with pytest.raises(Crash):
            dying.process(order)
    [orphan] = _beside_stream(billing_table, customer)
    sender = _sender(table, billing_table)
    assert sender.process(order).status == "duplicate"
    [invoice] = [m for m in sender.publisher.deliveries if m.type == "Invoice"]  # type: ignore[attr-defined]
    token = invoice.headers[TOKEN_HEADER].partition(":")[2]
    assert _beside_stream(billing_table, customer) == [f"Billing|TK-{token}"] != [orphan]
    # The dead attempt's registration stays for retention (an attempt still
    # running could be creating tokens behind it); the others are gone.
    checkpoint, registration = _beside_stream(table, shop)
    assert checkpoint == "Orders|TC-o-1"
    assert registration.startswith("Orders|TR-")
    receiver = Processor(billing, billing_table, InMemoryPublisher())
    assert receiver.process(invoice).status == "completed"
    assert receiver.current_state(customer).state.owed == 40


def test_token_receivers_are_checked_before_anything_is_sent(
    table: TableClient, billing_table: TableClient
) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"Order": TokenReceiver("Billing", billing_table)}, "a type handler 'Orders' takes"),
        ({"Invoice": ("Billing", billing_table)}, "must be a TokenReceiver"),
        ({"Invoice": TokenReceiver("Orders", table)}, "is the handler itself"),
    ]
    for receivers, error in cases:
        with pytest.raises(ValueError, match=error):
            Processor(orders, table, InMemoryPublisher(), tokens=True, token_receivers=receivers)
    with pytest.raises(ValueError, match="must be an identifier, got 'no name'"):
        TokenReceiver("no name", billing_table)
