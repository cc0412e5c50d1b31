"""Adversary round 3: a real socket's faults on the write that carries a
token consumer's checkpoint, and on the checkpoint's delete after its
outputs went out: the notice goes out identical, the credit applies once,
and nothing outlives retention."""

from __future__ import annotations

import itertools

import pytest
from azure.data.tables import TableClient

from azurite.proxy import Action, Proxy, Request
from handlers import HeaderCache, InMemoryPublisher, Message, Processor
from streamstone_py import RetryPolicy, WireTableClient
from tests.test_handlers_cache import counted
from tests.test_tokens_awaiting import _credits
from tests.test_tokens_compositions import wallets
from tests.tokening import token_rows

ONCE = RetryPolicy(attempts=1)


def _receive(request: Request) -> bool:
    return b"$batch" in request.head and b"SS-SE" in request.body and b"|TC-" in request.body


def _sweep(request: Request) -> bool:
    head = request.head + request.body
    return b"TC-" in head and b"DELETE" in head and b"SS-SE" not in request.body


@pytest.mark.parametrize("action", ["drop", "behead", "throttle"])
@pytest.mark.parametrize("step", ["receive", "sweep"])
def test_a_lost_answer_around_the_awaited_notice(
    connection_string: str, table: TableClient, proxy: Proxy, game: str, step: str, action: Action
) -> None:
    a, b = f"{game}-a", f"{game}-b"
    [credit] = _credits(table, a, b, 1)
    hits = itertools.count()
    chosen = _receive if step == "receive" else _sweep

    def plan(request: Request) -> Action:
        return action if chosen(request) and next(hits) == 0 else "pass"

    through = WireTableClient.from_connection_string(
        proxy.endpoint_of(connection_string), table.table_name
    )
    out = InMemoryPublisher()
    faulty = Processor(wallets, through, out, tokens=True, retry=ONCE)
    proxy.plan(plan)
    seen = [faulty.process(credit).status for _ in range(2)]
    assert next(hits) > 0, "the step was never seen"
    assert seen[1] != "faulted"
    clean = Processor(wallets, table, out, tokens=True)
    for i in range(2):
        clean.process(Message(f"{b}-d{i}", b, "Deposit", {"amount": 1}))
    clean.retain(b, keep_last=0)
    assert token_rows(table, b) == {}
    assert clean.process(credit).kind == "consumed"
    assert clean.current_state(b).state.balance == 3
    # At least once, identical on every send.
    assert out.deliveries
    assert len({m.id for m in out.deliveries}) == 1
    assert {(m.type, str(m.body)) for m in out.deliveries} == {
        ("Credited", str({"amount": 1, "balance": 1}))
    }
    through.close()


@pytest.mark.parametrize(("n", "expected"), [(1, 2), (24, 2), (30, 3), (60, 4)])
def test_what_a_token_consumer_with_outputs_pays(
    connection_string: str, table: TableClient, game: str, n: int, expected: int
) -> None:
    """Its writes (four rows a credit: event, id, the token's delete, the
    checkpoint; 24 a transaction) and one delete of the checkpoints per 100
    after the publish (a header cache: no read)."""
    a, b = f"{game}-a", f"{game}-b"
    credits = _credits(table, a, b, n)
    client, plan = counted(connection_string, table)
    receiver = Processor(wallets, client, InMemoryPublisher(), tokens=True, cache=HeaderCache())
    receiver.process(Message(f"{b}-d", b, "Deposit", {"amount": 1}))
    before = plan.requests
    assert {o.kind for o in receiver.process_batch(b, credits)} == {"completed"}
    assert (plan.requests - before, token_rows(table, b)) == (expected, {})
