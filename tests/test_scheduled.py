"""Scheduled messages: ``ctx.schedule``, the ``due`` a message carries through
every encoding, and ``check_handler`` comparing it."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

import pytest

from handlers import (
    MAX_SCHEDULE_DELAY,
    HandlerContext,
    Message,
    decode_envelope,
    encode_envelope,
    handler,
)
from handlers._messages._codec import pack
from handlers.examples import orders
from handlers.testing import check_handler

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def context() -> HandlerContext:
    return HandlerContext(Message("m-1", "o-1", "PlaceOrder"), handler="Orders", now=NOW)


def test_schedule_derives_its_due_from_now_and_its_id_like_every_output() -> None:
    first, again = context(), context()
    a = first.schedule("PaymentTimeout", {"order": "o-1"}, after=timedelta(minutes=15))
    b = again.schedule("PaymentTimeout", {"order": "o-1"}, after=timedelta(minutes=15))
    assert a == b
    assert a.due == datetime(2026, 11, 24, 12, 15, tzinfo=UTC)
    assert first.outputs == (a,)
    at = context().schedule(
        "T", at=datetime(2026, 11, 24, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    )
    assert at.due == NOW  # kept in UTC


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({}, "schedule needs exactly one of after= or at="),
        ({"after": timedelta(1), "at": NOW}, "schedule needs exactly one of after= or at="),
        ({"after": timedelta(seconds=-1)}, "after must not be negative, got -1 day, 23:59:59"),
        ({"at": datetime(2026, 11, 25)}, "at must be a datetime with a time zone"),
        (
            {"after": MAX_SCHEDULE_DELAY + timedelta(seconds=1)},
            "cannot schedule 'T' 7 days, 0:00:01 ahead (due 2026-12-01T12:00:01+00:00): "
            "at most 7 days, the longest Azure Storage Queues hide a message",
        ),
    ],
)
def test_schedule_refuses_what_no_queue_could_deliver(kwargs: dict, error: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match="^" + re.escape(error)):
        context().schedule("T", **kwargs)


def test_exactly_seven_days_ahead_is_taken() -> None:
    assert context().schedule("T", after=MAX_SCHEDULE_DELAY).due == NOW + MAX_SCHEDULE_DELAY


def test_due_travels_in_the_encoded_message_and_the_envelope() -> None:
    plain = Message("o-1", "k", "T", {"a": 1})
    scheduled = Message("o-1", "k", "T", {"a": 1}, due=NOW)
    # A message without a due encodes as it did before due existed: stored digests hold.
    assert plain.encode() == pack([1, "o-1", "k", "T", {"a": 1}, {}])
    assert Message.decode(scheduled.encode()) == scheduled
    assert Message.decode(plain.encode()) == plain
    assert plain != scheduled
    assert '"due":"2026-11-24T12:00:00+00:00"' in encode_envelope(scheduled)
    assert decode_envelope(encode_envelope(scheduled)) == scheduled
    with pytest.raises(ValueError, match="message due must be a datetime with a time zone"):
        Message("o-1", "k", "T", due=datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="due must be ISO-8601 text, got 5"):
        decode_envelope('{"id":"1","key":"k","type":"T","due":5}')


@handler("Hasty", None, types=["Go"])
def hasty(state: dict, message: Message, ctx: HandlerContext) -> None:  # type: ignore[type-arg]
    ctx.schedule("Later", at=datetime.now(UTC) + timedelta(minutes=1))  # the wall clock: wrong


def test_check_handler_compares_the_due_of_scheduled_outputs() -> None:
    report = check_handler(hasty, [Message("g-1", "k", "Go")], hash_seeds=())
    assert not report.deterministic
    assert [d.path for d in report.differences] == ["outputs[0].due"]
    good = check_handler(
        orders,
        [
            Message("p-1", "o-1", "PlaceOrder", {"amount": 5}),
            Message("t-1", "o-1", "PaymentTimeout", {"order": "o-1"}),
        ],
    )
    good.raise_for_differences()
