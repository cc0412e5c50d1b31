"""Faults on a real socket (a proxy in front of Azurite) at each token step
of the sender, and at the receiver's write that consumes the token: the
request is applied and its answer lost (``drop``, ``behead``, ``truncate``)
or throttled. Redelivery until done, then every credit twice, then
retention and every credit again: B is credited once, and no token,
registration or checkpoint outlives the run."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from azure.data.tables import TableClient

from azurite.proxy import Action, Proxy, Request
from handlers import InMemoryPublisher, Message, Processor
from handlers.examples import accounts
from streamstone_py import RetryPolicy, WireTableClient
from tests.tokening import credits, token_rows

#: No retry of a request: the fault reaches the outcome, and redelivery resolves it.
ONCE = RetryPolicy(attempts=1)

#: The $batch a step sends, told by its body.
STEPS: dict[str, Callable[[bytes], bool]] = {
    "register": lambda b: b"|TR-" in b and b"Targets" in b,
    "create": lambda b: b"|TK-" in b and b"MessageId" in b,
    "checkpoint": lambda b: b"|TC-" in b and b"Tokens" in b,
    "finish": lambda b: b"|TC-" in b and b"Dispatched" in b and b"Tokens" not in b,
    "receive": lambda b: b"SS-SE" in b and b"TK-" in b,
}


@pytest.mark.parametrize("action", ["drop", "behead", "truncate", "throttle"])
@pytest.mark.parametrize("step", list(STEPS))
def test_a_lost_answer_at_each_token_step_credits_once(
    connection_string: str, table: TableClient, proxy: Proxy, game: str, step: str, action: Action
) -> None:
    a, b = f"{game}-a", f"{game}-b"
    hits = itertools.count()

    def plan(request: Request) -> Action:
        if b"$batch" in request.head and STEPS[step](request.body) and next(hits) == 0:
            return action
        return "pass"

    through = WireTableClient.from_connection_string(
        proxy.endpoint_of(connection_string), table.table_name
    )
    publisher = InMemoryPublisher()
    p = Processor(accounts, through, publisher, tokens=True, retry=ONCE)
    clean = Processor(accounts, table, publisher, tokens=True)
    clean.process(Message("dep-a", a, "Deposit", {"amount": 100}))
    proxy.plan(plan)
    transfer = Message("t-1", a, "Transfer", {"to": b, "amount": 30})
    # Redelivered while faulted (a fault is met once: the second try must do).
    seen = [p.process(transfer).status for _ in range(2)]
    for c in credits(publisher.deliveries):
        seen += [p.process(c).status for _ in range(2)]
    # A sender step's fault faults the transfer (no retry of a request); the
    # receiver's write is resolved by reading, unless nothing was applied.
    assert seen[0] == ("completed" if step == "receive" else "faulted")
    assert "faulted" not in seen[1::2]
    assert next(hits) > 0, "the step was never seen"
    for c in credits(publisher.deliveries):
        clean.process(c)
    clean.process(Message("dep-b", b, "Deposit", {"amount": 1}))
    clean.process(Message("dep-a2", a, "Deposit", {"amount": 1}))
    clean.retain(a, keep_last=0)
    clean.retain(b, keep_last=0)
    for c in credits(publisher.deliveries):
        assert clean.process(c).status == "duplicate"
    assert clean.current_state(a).state.balance == 71
    assert clean.current_state(b).state.balance == 31
    assert len({c.headers["ss-token"] for c in credits(publisher.deliveries)}) == 1
    assert token_rows(table, a) == token_rows(table, b) == {}
    through.close()
