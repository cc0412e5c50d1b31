"""Example handlers: the seed's ShootingRange and LeaderBoard, and Orders.

ShootingRange (one state per game): ``StartNewRound`` places the target at a
random position; ``FireAt`` at the target publishes ``Hit``, elsewhere
``Missed``; after ``MAX_ATTEMPTS`` shots the target moves to a position from
``context.random()``. LeaderBoard (one state per game) counts the ``Hit`` and
``Missed`` messages ShootingRange publishes.

Orders (one state per order) shows a timer: ``PlaceOrder`` schedules a
``PaymentTimeout`` (``PAYMENT_TIMEOUT`` later, or the order's own
``pay_within_seconds``); ``PayOrder`` pays a placed order (``OrderPaid``);
the timeout cancels an order still unpaid (``OrderCancelled``) and does
nothing once it is paid.

Accounts (one state per account) sends messages to its own keys: a
``Transfer`` debits the account and publishes a ``Credit`` to the account
``to`` (with tokens, the credit carries one), and a ``Transferred`` notice;
``Deposit`` and ``Credit`` add their ``amount``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from ._context import HandlerContext
from ._handler import handler
from ._messages._message import Message

__all__ = [
    "MAX_ATTEMPTS",
    "PAYMENT_TIMEOUT",
    "Account",
    "LeaderBoard",
    "Order",
    "ShootingRange",
    "accounts",
    "leader_board",
    "orders",
    "shooting_range",
]

MAX_ATTEMPTS = 3
POSITIONS = 100
#: How long an order waits for its payment, unless it says otherwise.
PAYMENT_TIMEOUT = timedelta(minutes=15)


@dataclass
class ShootingRange:
    target_position: int = 0
    number_of_attempts: int = 0
    rounds: int = 0


@dataclass
class LeaderBoard:
    hits: int = 0
    misses: int = 0
    players: dict[str, int] = field(default_factory=dict)


@handler("ShootingRange", ShootingRange, types=["StartNewRound", "FireAt"])
def shooting_range(state: ShootingRange, message: Message, ctx: HandlerContext) -> None:
    body = message.body or {}
    if message.type == "StartNewRound":
        state.rounds += 1
        state.number_of_attempts = 0
        state.target_position = ctx.random().randrange(POSITIONS)
        return
    position = body["position"]
    hit = position == state.target_position
    ctx.publish(
        "Hit" if hit else "Missed",
        {
            "game": message.key,
            "player": body.get("player", ""),
            "position": position,
            "attempt_of": message.id,
        },
    )
    if state.number_of_attempts + 1 >= MAX_ATTEMPTS:
        state.number_of_attempts = 0
        state.target_position = ctx.random().randrange(POSITIONS)
    else:
        state.number_of_attempts += 1


@handler("LeaderBoard", LeaderBoard, types=["Hit", "Missed"])
def leader_board(state: LeaderBoard, message: Message, ctx: HandlerContext) -> None:
    player = (message.body or {}).get("player", "")
    if message.type == "Hit":
        state.hits += 1
        state.players[player] = state.players.get(player, 0) + 1
    else:
        state.misses += 1


@dataclass
class Order:
    #: "new", then "placed", then "paid" or "cancelled".
    status: str = "new"
    amount: int = 0


@handler("Orders", Order, types=["PlaceOrder", "PayOrder", "PaymentTimeout"])
def orders(state: Order, message: Message, ctx: HandlerContext) -> None:
    body = message.body or {}
    if message.type == "PlaceOrder":
        if state.status != "new":
            return  # placed once: a second PlaceOrder changes nothing
        state.status, state.amount = "placed", int(body.get("amount", 0))
        wait = body.get("pay_within_seconds")
        after = PAYMENT_TIMEOUT if wait is None else timedelta(seconds=wait)
        ctx.schedule("PaymentTimeout", {"order": message.key}, after=after)
    elif message.type == "PayOrder":
        if state.status == "placed":
            state.status = "paid"
            ctx.publish("OrderPaid", {"order": message.key, "amount": state.amount})
    elif state.status == "placed":  # PaymentTimeout, and no payment came first
        state.status = "cancelled"
        ctx.publish("OrderCancelled", {"order": message.key, "amount": state.amount})


@dataclass
class Account:
    balance: int = 0


@handler("Accounts", Account, types=["Deposit", "Transfer", "Credit"])
def accounts(state: Account, message: Message, ctx: HandlerContext) -> None:
    amount = message.body["amount"]
    if message.type == "Transfer":
        state.balance -= amount
        ctx.publish("Credit", {"amount": amount, "from": message.key}, key=message.body["to"])
        ctx.publish("Transferred", {"amount": amount, "to": message.body["to"]})
    else:  # Deposit, Credit
        state.balance += amount
