"""handlers.testing.check_handler: every way a handler can differ on a replay,
found with its path, and agreeing with what the runtime sees on Azurite."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from azure.data.tables import TableClient

from handlers import (
    HandlerContext,
    InMemoryPublisher,
    Message,
    NonDeterministicHandlerError,
    Processor,
    handler,
)
from handlers.examples import shooting_range
from handlers.testing import Difference, HandlerReport, check_handler

# Handlers are module attributes, so the subprocess runs can import them.


@handler("Minting")
def minting(state: dict[str, Any], message: Message, ctx: HandlerContext) -> None:
    state["order"] = str(uuid.uuid4())  # not ctx.new_id()
    state["n"] = state.get("n", 0) + 1


@handler("Clocked")
def clocked(state: dict[str, Any], message: Message, ctx: HandlerContext) -> None:
    ctx.publish("Seen", {"at": time.time(), "of": message.id})  # not ctx.now()


@handler("Careful")
def careful(state: dict[str, Any], message: Message, ctx: HandlerContext) -> None:
    state["at"] = ctx.capture("at", time.time)
    state["since"] = ctx.now().isoformat()
    state["order"] = ctx.new_id()
    state["dice"] = ctx.random().randrange(1000)
    ctx.publish("Seen", {"at": state["at"], "of": message.id})


_SEEN: list[str] = []


@handler("Remembering")
def remembering(state: dict[str, Any], message: Message, ctx: HandlerContext) -> None:
    _SEEN.append(message.id)  # state kept outside the handler's state
    state["seen"] = len(_SEEN)


_NAMES = ["ash", "birch", "cedar", "elm", "fir", "hazel", "larch", "oak", "pine", "yew"]


@handler("Hashing")
def hashing(state: dict[str, Any], message: Message, ctx: HandlerContext) -> None:
    for name in set(_NAMES):  # iterates in the order of this process's string hashes
        ctx.publish("Tree", {"name": name})


@handler("Picky", types=["Aim"])
def picky(state: dict[str, Any], message: Message, ctx: HandlerContext) -> None:
    if message.body["position"] < 0:
        raise ValueError(f"bad position {message.body['position']}")
    state["last"] = message.body["position"]


_FAILED_ONCE: set[str] = set()


@handler("Flaky")
def flaky(state: dict[str, Any], message: Message, ctx: HandlerContext) -> None:
    if message.id not in _FAILED_ONCE:
        _FAILED_ONCE.add(message.id)
        raise TimeoutError("lookup timed out")
    state["done"] = True


def _messages(key: str, count: int, type_: str = "Do") -> list[Message]:
    return [Message(f"m-{n}", key, type_, {"n": n}) for n in range(1, count + 1)]


def test_a_deterministic_handler_passes_in_every_run() -> None:
    messages = [Message("m-1", "g-1", "StartNewRound"), Message("m-1", "g-2", "StartNewRound")]
    messages += [
        Message(f"m-{n}", f"g-{1 + n % 2}", "FireAt", {"position": n, "player": "ann"})
        for n in range(2, 9)
    ]

    report = check_handler(shooting_range, messages)

    assert report == HandlerReport("ShootingRange", 9, (1, 2, 3), (), ())
    assert report.ok
    assert str(report) == (
        "handler 'ShootingRange': 9 messages, each twice in this process and once per "
        "PYTHONHASHSEED in 1, 2, 3: deterministic"
    )
    report.raise_for_differences()


def test_the_report_counts_in_words_that_agree_with_the_number() -> None:
    one = HandlerReport("ShootingRange", 1, (), (), ())

    assert str(one) == "handler 'ShootingRange': 1 message, each twice in this process: " \
        "deterministic"  # fmt: skip


def test_the_context_s_clock_ids_random_and_captures_are_deterministic() -> None:
    report = check_handler(careful, _messages("k", 3), hash_seeds=(1,))
    assert report.ok, str(report)


def test_uuid4_is_found_in_the_state_with_its_path() -> None:
    report = check_handler(minting, _messages("k", 2), hash_seeds=())

    assert report.hash_seeds == ()
    assert [(d.message_id, d.run, d.path) for d in report.differences] == [
        ("m-1", "second run", "state['order']"),
        ("m-2", "second run", "state['order']"),
    ]
    first = report.differences[0]
    assert str(uuid.UUID(first.first)) == first.first != first.second
    with pytest.raises(AssertionError, match=r"m-1 \(second run\): state\['order'\]: "):
        report.raise_for_differences()


def test_time_time_is_found_in_an_output_with_its_path() -> None:
    report = check_handler(clocked, _messages("k", 1), hash_seeds=())

    [difference] = report.differences
    assert (difference.message_id, difference.run, difference.path) == (
        "m-1",
        "second run",
        "outputs[0].body['at']",
    )
    assert isinstance(difference.first, float)
    assert difference.first != difference.second


def test_state_kept_outside_the_handler_is_found() -> None:
    _SEEN.clear()
    report = check_handler(remembering, _messages("k", 2), hash_seeds=())

    assert report.differences == (
        Difference("m-1", "second run", "state['seen']", 1, 2),
        Difference("m-2", "second run", "state['seen']", 3, 4),
    )


def test_the_order_of_a_set_of_strings_is_found_only_in_another_process() -> None:
    in_process = check_handler(hashing, _messages("k", 1), hash_seeds=())
    assert in_process.ok

    report = check_handler(hashing, _messages("k", 1), hash_seeds=(1, 2, 3))

    runs = {d.run for d in report.differences}
    # Ten names come out in the same order under two hash seeds once in 10! times.
    assert runs == {"PYTHONHASHSEED=1", "PYTHONHASHSEED=2", "PYTHONHASHSEED=3"}
    assert {d.message_id for d in report.differences} == {"m-1"}
    for d in report.differences:
        assert d.path in {f"outputs[{i}].body['name']" for i in range(10)}
        assert {d.first, d.second} <= set(_NAMES)
        assert d.first != d.second


def test_a_message_the_handler_always_refuses_is_a_failure_not_a_difference() -> None:
    messages = [
        Message("m-1", "k", "Aim", {"position": 3}),
        Message("m-2", "k", "Aim", {"position": -1}),
        Message("m-3", "k", "Aim", {"position": 5}),
    ]

    report = check_handler(picky, messages, hash_seeds=(1,))

    # Deterministic, but a finding: a pipeline abandons m-2 on every delivery.
    assert report.deterministic
    assert not report.ok
    assert report.failures == (("m-2", "ValueError: bad position -1"),)
    assert str(report) == (
        "handler 'Picky': 3 messages, each twice in this process and once per "
        "PYTHONHASHSEED in 1: deterministic; raised on 1 of 3 messages\n"
        "  m-2: raised in every run: ValueError: bad position -1\n"
        "  (a message the handler raises on is abandoned in a pipeline)"
    )
    with pytest.raises(AssertionError, match="m-2: raised in every run"):
        report.raise_for_differences()
    report.raise_for_differences(allow_failures=True)  # a test that expects the refusal


@handler("Broken")
def broken(state: dict[str, Any], message: Message, ctx: HandlerContext) -> None:
    state["total"] += message.body["amount"]  # KeyError: no "amount" in these bodies


def test_a_handler_that_raises_on_every_message_is_not_ok() -> None:
    report = check_handler(broken, _messages("k", 3), hash_seeds=())

    assert not report.ok
    assert report.deterministic  # the same KeyError each time, so nothing differs
    assert [m for m, _ in report.failures] == ["m-1", "m-2", "m-3"]
    assert str(report).splitlines()[0] == (
        "handler 'Broken': 3 messages, each twice in this process: "
        "raised on every message (3 of 3), so nothing was compared"
    )
    with pytest.raises(AssertionError, match="raised on every message"):
        report.raise_for_differences()


def test_a_handler_that_raises_only_once_is_found() -> None:
    _FAILED_ONCE.clear()
    report = check_handler(flaky, _messages("k", 1), hash_seeds=())

    assert report.differences == (
        Difference("m-1", "second run", "raised", "TimeoutError: lookup timed out", None),
    )


def test_bad_arguments_are_refused_with_the_bad_value() -> None:
    @handler("Local")
    def local(state: dict[str, Any], message: Message, ctx: HandlerContext) -> None:
        pass

    with pytest.raises(ValueError, match=r"'Local' is not an attribute .* pass spec="):
        check_handler(local, _messages("k", 1))
    assert check_handler(local, _messages("k", 1), hash_seeds=()).ok
    with pytest.raises(ValueError, match=r"type 'Do', which handler 'Picky' does not accept"):
        check_handler(picky, _messages("k", 1), hash_seeds=())
    with pytest.raises(ValueError, match=r"hash_seeds must be ints >= 0, got \(-1,\)"):
        check_handler(picky, [], hash_seeds=(-1,))
    with pytest.raises(TypeError, match=r"messages must be handlers\.Message, got 'm-1'"):
        check_handler(picky, ["m-1"], hash_seeds=())  # type: ignore[list-item]


def test_what_the_check_finds_is_what_the_runtime_refuses_on_azurite(
    table: TableClient, game: str
) -> None:
    """A duplicate of a flagged handler's message is refused as non-deterministic;
    a passed handler's duplicate is replayed with identical outputs."""
    message = Message("m-1", game, "Do", {"n": 1})
    sloppy = Processor(clocked, table, InMemoryPublisher())
    assert sloppy.process(message).status == "completed"
    with pytest.raises(NonDeterministicHandlerError, match="'Clocked' is not deterministic"):
        sloppy.process(message)
    assert not check_handler(clocked, [message], hash_seeds=()).ok

    publisher = InMemoryPublisher()
    sound = Processor(careful, table, publisher)
    first = sound.process(Message("m-1", game + "-c", "Do"))
    again = sound.process(Message("m-1", game + "-c", "Do"))
    assert (first.status, again.status) == ("completed", "duplicate")
    assert again.outputs == first.outputs
    assert check_handler(careful, [Message("m-1", game + "-c", "Do")], hash_seeds=()).ok
