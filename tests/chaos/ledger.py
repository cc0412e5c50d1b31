"""The handler under chaos, and the model it is checked against.

``ChaosLedger`` is order-sensitive on purpose: its state carries a hash chain
over the ids of the messages it applied, and a withdrawal succeeds or is
rejected depending on the balance before it. Only the serial fold of a key's
distinct messages, in the order they were first stored, gives the stored
state and outputs, so a lost, doubled or reordered update cannot pass.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from handlers import HandlerContext, Message, handler

HANDLER = "ChaosLedger"
TYPES = ("Deposit", "Withdraw", "Audit")

#: The fault hook of the current worker thread (``None`` in the model).
hooks = threading.local()


@dataclass
class Ledger:
    balance: int = 0
    applied: int = 0
    rejected: int = 0
    chain: str = ""


def _in_handler() -> None:
    hook: Callable[[], None] | None = getattr(hooks, "in_handler", None)
    if hook is not None:
        hook()


@handler(HANDLER, Ledger, types=TYPES)
def ledger(state: Ledger, message: Message, ctx: HandlerContext) -> None:
    _in_handler()
    amount = int(message.body["amount"])
    state.applied += 1
    state.chain = hashlib.sha256(f"{state.chain}/{message.id}".encode()).hexdigest()[:16]
    if message.type == "Deposit":
        state.balance += amount
        ctx.publish("Deposited", {"amount": amount, "balance": state.balance})
    elif message.type == "Withdraw" and amount <= state.balance:
        state.balance -= amount
        ctx.publish("Withdrawn", {"amount": amount, "balance": state.balance})
    elif message.type == "Withdraw":
        state.rejected += 1
        ctx.publish("Rejected", {"amount": amount, "balance": state.balance})
    else:
        audit = {"balance": state.balance, "applied": state.applied, "chain": state.chain}
        ctx.publish("Audited", {**audit, "token": ctx.random().randrange(10**9)})
        if ctx.random().random() < 0.5:
            ctx.publish("Notice", {"rejected": state.rejected}, key=f"{message.key}-notices")


def fold(messages: Sequence[Message]) -> list[tuple[bytes, tuple[Message, ...]]]:
    """The serial, fault-free run: the state and the outputs after each message."""
    state = ledger.initial_state()
    steps = []
    for message in messages:
        ctx = HandlerContext(message, handler=HANDLER, now=datetime.fromtimestamp(0, UTC))
        state = ledger.apply(state, message, ctx)
        steps.append((ledger.encode_state(state), ctx.outputs))
    return steps
