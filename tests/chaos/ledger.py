"""The handler under chaos, and the model it is checked against.

``ChaosLedger`` is order-sensitive on purpose: its state carries a hash chain
over the ids of the messages it applied, and a withdrawal succeeds or is
rejected depending on the balance before it. Only the serial fold of a key's
distinct messages, in the order they were first stored, gives the stored
state and outputs, so a lost, doubled or reordered update cannot pass.

``StrictWithdraw`` raises instead of publishing a rejection when the balance
is short, so whether the handler fails depends on the state it runs on: a
redelivered original must be answered from its stored version, never run on
the newest state.

The state class evolves midway through a run: ``ledger_v2`` is the same
handler (same name, same body) over :class:`LedgerV2`, which dropped
``legacy`` and gained ``fee_rate`` with a default. Both behave identically on
the fields they share, so the model is the v1 fold compared on those fields,
whichever version processed each message.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from handlers import Handler, HandlerContext, Message, handler
from handlers._messages._codec import unpack

HANDLER = "ChaosLedger"
TYPES = ("Deposit", "Withdraw", "StrictWithdraw", "Audit")

#: The fault hook of the current worker thread (``None`` in the model).
hooks = threading.local()


class Overdrawn(ValueError):
    """A strict withdrawal larger than the balance it ran on."""


@dataclass
class Ledger:
    balance: int = 0
    applied: int = 0
    rejected: int = 0
    chain: str = ""
    legacy: str = "v1"


@dataclass
class LedgerV2:
    balance: int = 0
    applied: int = 0
    rejected: int = 0
    chain: str = ""
    fee_rate: int = 0


#: The fields both versions have: the oracle compares states on these.
SHARED = ("balance", "applied", "rejected", "chain")
FIELDS = {1: frozenset({*SHARED, "legacy"}), 2: frozenset({*SHARED, "fee_rate"})}


class _State(Protocol):
    balance: int
    applied: int
    rejected: int
    chain: str


def _in_handler() -> None:
    hook: Callable[[], None] | None = getattr(hooks, "in_handler", None)
    if hook is not None:
        hook()


def _apply(state: _State, message: Message, ctx: HandlerContext) -> None:
    _in_handler()
    amount = int(message.body["amount"])
    if message.type == "StrictWithdraw" and amount > state.balance:
        raise Overdrawn(f"{amount} > balance {state.balance}")
    state.applied += 1
    state.chain = hashlib.sha256(f"{state.chain}/{message.id}".encode()).hexdigest()[:16]
    if message.type == "Deposit":
        state.balance += amount
        ctx.publish("Deposited", {"amount": amount, "balance": state.balance})
    elif message.type in ("Withdraw", "StrictWithdraw") and amount <= state.balance:
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


@handler(HANDLER, Ledger, types=TYPES)
def ledger(state: Ledger, message: Message, ctx: HandlerContext) -> None:
    _apply(state, message, ctx)


@handler(HANDLER, LedgerV2, types=TYPES)
def ledger_v2(state: LedgerV2, message: Message, ctx: HandlerContext) -> None:
    _apply(state, message, ctx)


VERSIONS: dict[int, Handler[Any]] = {1: ledger, 2: ledger_v2}


def shared(state: bytes) -> tuple[dict[str, Any], int | None]:
    """A stored state's shared fields, and which version's class wrote it (None: neither)."""
    values = unpack(state)
    fields = frozenset(values)
    version = next((v for v, known in FIELDS.items() if known == fields), None)
    return {k: values.get(k) for k in SHARED}, version


@dataclass(frozen=True)
class Step:
    """The model after one message: its state and outputs, or why it raised."""

    state: bytes
    outputs: tuple[Message, ...]
    failure: str | None = None


def fold(messages: Sequence[Message]) -> list[Step]:
    """The serial, fault-free run: the state and the outputs after each message.

    A message that raises leaves the state as it was (it could not have been
    stored): its step says why.
    """
    state = ledger.initial_state()
    steps = []
    for message in messages:
        ctx = HandlerContext(message, handler=HANDLER, now=datetime.fromtimestamp(0, UTC))
        try:
            state = ledger.apply(state, message, ctx)
        except Overdrawn as exc:
            steps.append(Step(ledger.encode_state(state), (), repr(exc)))
            continue
        steps.append(Step(ledger.encode_state(state), ctx.outputs))
    return steps
