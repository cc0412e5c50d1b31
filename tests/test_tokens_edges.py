"""The edges of tokens: headers that are not this handler's, forged or
repeated tokens, a token no row key holds, an output whose token could not
be sent, and tokens turned on with versions stored before."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from azure.data.tables import TableClient

from handlers import TOKEN_HEADER, HandlerContext, InMemoryPublisher, Message, Processor, handler
from handlers.examples import accounts, orders
from tests.tokening import H, credits, token_rows


def credit(n: int, key: str, header: str | None) -> Message:
    headers = {} if header is None else {"ss-token": header}
    return Message(f"c-{n}", key, "Credit", {"amount": 5}, headers)


def test_a_header_for_another_handler_is_a_message_from_outside(
    table: TableClient, game: str
) -> None:
    p = Processor(accounts, table, InMemoryPublisher(), tokens=True)
    outcomes = p.process_batch(game, [credit(1, game, "Ledger:" + "a" * 32), credit(2, game, None)])
    assert [o.kind for o in outcomes] == ["completed", "completed"]
    assert p.current_state(game).state.balance == 10


def test_a_forged_or_repeated_token_is_consumed_and_a_bad_one_refused(
    table: TableClient, game: str
) -> None:
    p = Processor(accounts, table, InMemoryPublisher(), tokens=True)
    forged = credit(1, game, f"{H}:{'f' * 32}")  # no such token was ever made
    bad = credit(2, game, f"{H}:a/b")  # no row key holds a /
    outcomes = p.process_batch(game, [forged, bad])
    assert [(o.status, o.kind) for o in outcomes] == [
        ("duplicate", "consumed"), ("abandoned", "refused")
    ]  # fmt: skip
    assert "carries a token no row key can hold" in str(outcomes[1].reason)
    assert p.current_state(game).version == 0

    a, b = f"{game}-a", f"{game}-b"
    publisher = InMemoryPublisher()
    sender = Processor(accounts, table, publisher, tokens=True)
    sender.process(Message("t-1", a, "Transfer", {"to": b, "amount": 30}))
    [sent] = credits(publisher.deliveries)
    twin = Message("twin", b, "Credit", {"amount": 30}, sent.headers)  # another id, its token
    outcomes = p.process_batch(b, [sent, twin])
    assert [o.kind for o in outcomes] == ["completed", "consumed"]
    assert p.current_state(b).state.balance == 30
    assert token_rows(table, b) == {}


def test_an_output_whose_token_cannot_be_registered_is_refused_before_the_state(
    table: TableClient, game: str
) -> None:
    @handler("Fanout", types=["Spread", "Credit"])
    def fanout(state: dict[str, int], message: Message, ctx: HandlerContext) -> None:
        for n in range(message.body["keys"]):
            ctx.publish("Credit", {"n": n}, key=f"{'k' * 200}-{n}")

    p = Processor(fanout, table, InMemoryPublisher(), tokens=True)
    wide = Message("wide", game, "Spread", {"keys": 400})  # 400 keys of 200 characters
    outcomes = p.process_batch(game, [wide, Message("ok", game, "Spread", {"keys": 2})])
    assert [o.kind for o in outcomes] == ["failed", "completed"]
    assert "the registration of its tokens cannot be a table row" in str(outcomes[0].reason)
    assert p.current_state(game).version == 1


def test_tokens_turned_on_resend_what_went_out_before_without_them(
    table: TableClient, game: str
) -> None:
    a, b = f"{game}-a", f"{game}-b"
    before = InMemoryPublisher()
    transfer = Message("t-1", a, "Transfer", {"to": b, "amount": 30})
    Processor(accounts, table, before).process(transfer)
    after = InMemoryPublisher()
    again = Processor(accounts, table, after, tokens=True).process(transfer)
    assert again.status == "duplicate"
    assert [m.encode() for m in after.deliveries] == [m.encode() for m in before.deliveries]
    assert "ss-token" not in credits(after.deliveries)[0].headers
    assert token_rows(table, a) == token_rows(table, b) == {}


def test_a_timer_to_its_own_key_carries_a_token(table: TableClient, game: str) -> None:
    publisher = InMemoryPublisher()
    p = Processor(orders, table, publisher, tokens=True)
    p.process(Message("o-1", game, "PlaceOrder", {"amount": 5}))
    [timeout] = [m for m in publisher.deliveries if m.type == "PaymentTimeout"]
    assert timeout.headers["ss-token"].startswith("Orders:")
    assert timeout.due is not None
    assert p.process(timeout).kind == "completed"
    assert p.retain(game, keep_last=0) == 2
    assert p.process(timeout).kind == "consumed"
    assert p.current_state(game).state.status == "cancelled"
    assert token_rows(table, game) == {}


@handler("Strict", types=["Open", "Debit"])
def strict(state: dict[str, int], message: Message, ctx: HandlerContext) -> None:
    if message.type == "Open":
        state["balance"] = message.body["amount"]
        ctx.publish("Debit", {"amount": message.body["amount"]})  # to its own key
    elif state["balance"] < message.body["amount"]:
        raise ValueError("overdrawn")
    else:
        state["balance"] -= message.body["amount"]


def test_a_copy_whose_token_is_gone_is_consumed_even_where_the_handler_now_fails(
    table: TableClient, game: str
) -> None:
    publisher = InMemoryPublisher()
    p = Processor(strict, table, publisher, tokens=True)
    p.process(Message("open", game, "Open", {"amount": 10}))
    [debit] = publisher.deliveries
    assert p.process(debit).kind == "completed"
    assert p.retain(game, keep_last=0) == 2
    again = p.process(debit)  # on today's state it would overdraw
    assert (again.status, again.kind) == ("duplicate", "consumed")
    assert p.current_state(game).state == {"balance": 0}


def test_by_caller_retention_waits_for_the_callers_mark(table: TableClient, game: str) -> None:
    """``dispatch="by_caller"`` (a Spark task, whose outputs are final only
    once its job commits): the checkpoint stays unmarked, so retention keeps
    the sender's versions, until :meth:`Processor.mark_dispatched`."""
    a, b = f"{game}-a", f"{game}-b"
    publisher = InMemoryPublisher()
    p = Processor(accounts, table, publisher, tokens=True, dispatch="by_caller")
    p.process(Message("t-1", a, "Transfer", {"to": b, "amount": 3}))
    p.process(Message("t-2", a, "Transfer", {"to": b, "amount": 4}))
    for n in range(2):
        p.process(Message(f"d-{n}", a, "Deposit", {"amount": 1}))
    sent = [c.headers["ss-token"].partition(":")[2] for c in credits(publisher.deliveries)]
    unmarked = {
        f"{H}|TC-t-{n}": {"Tokens": [token], "Dispatched": False}
        for n, token in zip((1, 2), sent, strict=True)
    }
    assert token_rows(table, a) == unmarked
    assert p.retain(a, keep_last=1) == 0  # t-1 and t-2 wait for the caller
    p.mark_dispatched(a, ["t-1", "t-2", "d-0"])  # d-0 sent no token: skipped
    assert token_rows(table, a) == {
        k: {**v, "Dispatched": True} for k, v in unmarked.items()
    }  # fmt: skip
    assert p.retain(a, keep_last=1) == 2  # t-1, t-2 (d-0 is d-1's base)
    assert token_rows(table, a) == {}
    assert p.current_state(a).state.balance == -5


@dataclass
class Timer:
    fired: int = 0


@handler("Timers", Timer, types=["Start", "Fire"])
def timers(state: Timer, message: Message, ctx: HandlerContext) -> None:
    if message.type == "Start":
        ctx.schedule("Fire", {}, after=timedelta(minutes=5))
    else:
        state.fired += 1


def test_a_timer_to_the_key_itself_carries_a_token_and_fires_once_however_late(
    table: TableClient, game: str
) -> None:
    """``ctx.schedule`` to the handler's own key: the timer's message carries
    a token, so a copy delivered after retention removed its version is
    consumed, as a ``ctx.publish(..., key=...)`` is."""
    publisher = InMemoryPublisher()
    p = Processor(timers, table, publisher, tokens=True)
    p.process(Message("start", game, "Start"))
    [fire] = publisher.deliveries
    assert (fire.type, fire.key, fire.due is not None) == ("Fire", game, True)
    assert fire.headers[TOKEN_HEADER].startswith("Timers:")
    assert p.process(fire).status == "completed"
    p.process(Message("start-2", game, "Start"))
    p.process(Message("start-3", game, "Start"))
    assert p.retain(game, keep_last=1) >= 1
    late = p.process(fire)
    assert (late.status, late.kind, p.current_state(game).state.fired) == (
        "duplicate",
        "consumed",
        1,
    )
