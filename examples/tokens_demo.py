"""Transfers between accounts, every credit delivered again after retention,
side by side without tokens and with them: the money created out of nothing.

Run it with ``make demo-tokens``, or beside any account with
``STREAMSTONE_CONNECTION_STRING=... python examples/tokens_demo.py``.
"""

from __future__ import annotations

import random
import sys
import uuid
from collections import defaultdict

from _account import example_table
from azure.data.tables import TableClient

from handlers import InMemoryPublisher, Message, Processor
from handlers.examples import accounts

ACCOUNTS = 10
TRANSFERS = 100
OPENING = 1_000


def run(table: TableClient, tokens: bool, run_id: str) -> tuple[int, int, int]:
    """Money before, after the first deliveries, and after every credit came again."""
    publisher = InMemoryPublisher()
    p = Processor(accounts, table, publisher, tokens=tokens)
    keys = [f"{run_id}-{'t' if tokens else 'n'}{n}" for n in range(ACCOUNTS)]
    for key in keys:
        p.process(Message("opening", key, "Deposit", {"amount": OPENING}))
    draw = random.Random(7)
    transfers: dict[str, list[Message]] = defaultdict(list)
    for n in range(TRANSFERS):
        source, target = draw.sample(keys, 2)
        body = {"to": target, "amount": draw.randint(1, 50)}
        transfers[source].append(Message(f"t-{n}", source, "Transfer", body))
    for source, batch in transfers.items():
        p.process_batch(source, batch)
    sent: dict[str, list[Message]] = defaultdict(list)
    for credit in (m for m in publisher.deliveries if m.type == "Credit"):
        sent[credit.key].append(credit)

    def total() -> int:
        return sum(p.current_state(key).state.balance for key in keys)

    for key, credits in sent.items():  # the queue delivers each credit
        p.process_batch(key, credits)
    delivered = total()
    for key in keys:  # retention keeps nothing it need not
        p.retain(key, keep_last=0)
    for key, credits in sent.items():  # a replay of the whole queue, a month later
        p.process_batch(key, credits)
    return ACCOUNTS * OPENING, delivered, total()


def main() -> int:
    table = example_table("tokensdemo")
    if table is None:
        return 2
    run_id = uuid.uuid4().hex[:8]
    print(
        f"{ACCOUNTS} accounts of {OPENING}, {TRANSFERS} transfers; every credit is delivered "
        "once, retention removes what it may, then every credit comes again"
    )
    created: dict[bool, int] = {}
    for tokens in (False, True):
        opening, delivered, replayed = run(table, tokens, run_id)
        created[tokens] = replayed - opening
        mode = "with" if tokens else "without"
        print(f"{mode} tokens: {opening} before, {delivered} after the transfers, "
              f"{replayed} after the replay: {created[tokens]} created out of nothing")  # fmt: skip
    return 0 if created[True] == 0 and created[False] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
