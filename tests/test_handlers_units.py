"""Messages, the deterministic context, the receive lifecycle and state encoding."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from handlers import (
    Handler,
    HandlerContext,
    HandlerError,
    IllegalTransitionError,
    Message,
    NonDeterministicHandlerError,
    Receive,
    ReceiveState,
    handler,
)
from handlers.examples import ShootingRange, shooting_range

ROOT = Path(__file__).resolve().parents[1]
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_message_round_trips_and_encodes_canonically() -> None:
    a = Message("m1", "k", "T", {"b": [1, 2.5, None], "a": {"y": b"\x00", "x": "é"}}, {"h": "v"})
    b = Message("m1", "k", "T", {"a": {"x": "é", "y": b"\x00"}, "b": [1, 2.5, None]}, {"h": "v"})
    assert a.encode() == b.encode()
    assert Message.decode(a.encode()) == a
    with pytest.raises(TypeError):
        a.headers["h"] = "w"  # type: ignore[index]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"id": ""}, ValueError, "id must be a non-empty str"),
        ({"key": None}, ValueError, "key must be a non-empty str"),
        ({"body": {1: "x"}}, TypeError, "non-str key 1"),
        ({"body": {"when": NOW}}, TypeError, r"body of message 'm'\['when'\] is a datetime"),
        ({"headers": {"h": 1}}, TypeError, "headers must map str to str"),
    ],
)
def test_bad_messages_are_refused_naming_the_value(
    kwargs: dict[str, Any], error: type, match: str
) -> None:
    fields = {"id": "m", "key": "k", "type": "T", **kwargs}
    with pytest.raises(error, match=match):
        Message(**fields)


@pytest.mark.parametrize(
    "data", [b"", b"\xc1", b"\x93\x01\x02\x03", Message("m", "k", "T").encode()[:-1]]
)
def test_decoding_garbage_is_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError, match="not an encoded message"):
        Message.decode(data)


def test_context_derives_everything_from_the_message_id() -> None:
    message = Message("m-1", "k", "T")
    one = HandlerContext(message, handler="H", now=NOW)
    two = HandlerContext(message, handler="H", now=NOW)
    other_handler = HandlerContext(message, handler="G", now=NOW)
    ids = [one.new_id(), one.new_id()]
    assert ids == [two.new_id(), two.new_id()]
    assert ids[0] != ids[1]
    assert other_handler.new_id() != ids[0]
    assert [one.random().random() for _ in range(3)] == [two.random().random() for _ in range(3)]
    assert one.now() == NOW
    assert uuid.UUID(ids[0]).version == 5


def test_capture_is_taken_once_and_replayed() -> None:
    message = Message("m-1", "k", "T")
    first = HandlerContext(message, handler="H", now=NOW)
    assert first.capture("rate", lambda: 1.25) == 1.25
    assert first.capture("rate", lambda: 9.0) == 1.25
    replay = HandlerContext(message, handler="H", now=NOW, captures=first.captures, replay=True)
    assert replay.capture("rate", lambda: 9.0) == 1.25
    with pytest.raises(NonDeterministicHandlerError, match="capture 'other' was not taken"):
        replay.capture("other", lambda: 1)
    with pytest.raises(TypeError, match="capture 'bad'"):
        first.capture("bad", object)


def test_published_outputs_get_derived_ids_and_the_input_key() -> None:
    context = HandlerContext(Message("m-1", "game-7", "FireAt"), handler="H", now=NOW)
    out = context.publish("Hit", {"n": 1})
    assert (out.key, out.type, out.body) == ("game-7", "Hit", {"n": 1})
    assert context.outputs == (out,)
    namespace = uuid.uuid5(uuid.NAMESPACE_URL, "https://streamstone-py/handlers")
    assert out.id == str(uuid.uuid5(namespace, "H\x00game-7\x00m-1\x001"))
    # Versions stored before ids named the key replay with the scheme they were made with.
    old = HandlerContext(Message("m-1", "game-7", "FireAt"), handler="H", now=NOW, id_scheme=1)
    assert old.new_id() == str(uuid.uuid5(namespace, "H\x00m-1\x001"))
    with pytest.raises(ValueError, match="id_scheme must be 1 or 2, got 3"):
        HandlerContext(Message("m-1", "game-7", "FireAt"), handler="H", now=NOW, id_scheme=3)


DETERMINISM_SCRIPT = """
import sys
from datetime import UTC, datetime
from handlers import HandlerContext, Message
from handlers.examples import ShootingRange, shooting_range
state = ShootingRange()
out = []
shots = [("FireAt", {"position": p}) for p in range(9)]
for i, (t, body) in enumerate([("StartNewRound", None), *shots]):
    ctx = HandlerContext(Message(f"m{i}", "game", t, body), handler="ShootingRange",
                         now=datetime(2026, 1, 1, tzinfo=UTC))
    state = shooting_range.apply(state, ctx.message, ctx)
    out += [o.encode().hex() for o in ctx.outputs]
print(shooting_range.encode_state(state).hex())
print("\\n".join(out))
"""


def test_outputs_are_byte_identical_across_processes_and_hash_seeds() -> None:
    runs = []
    for seed in ("1", "987654", "random"):
        done = subprocess.run(
            [sys.executable, "-c", DETERMINISM_SCRIPT],
            capture_output=True, text=True, check=True, cwd=ROOT,
            env=dict(os.environ, PYTHONHASHSEED=seed),
        )  # fmt: skip
        runs.append(done.stdout)
    assert runs[0] == runs[1] == runs[2]
    assert len(runs[0].splitlines()) == 1 + 9  # the state, and one output per FireAt


def state_of(receive: Receive) -> ReceiveState:
    return receive.state


def test_receive_lifecycle_rules() -> None:
    events: list[str] = []
    done = Receive("m", on_complete=lambda r: events.append(f"complete:{r.state.value}"))
    done.complete()
    assert done.state is ReceiveState.COMPLETED
    assert events == ["complete:completing"]
    with pytest.raises(IllegalTransitionError, match="cannot complete"):
        done.complete()
    # One family: a caller catching HandlerError catches this one too.
    with pytest.raises(HandlerError):
        done.complete()
    with pytest.raises(IllegalTransitionError, match="cannot abandon"):
        done.abandon("late")
    done.fault("in doubt")
    done.fault("again")
    # Read through a call: mypy would keep done.state narrowed to COMPLETED
    # from the assert above, though fault() moved it on.
    assert state_of(done) is ReceiveState.FAULTED

    dropped = Receive("n", on_abandon=lambda r: events.append(f"abandon:{r.state.value}"))
    dropped.abandon("bad body")
    dropped.abandon("again")
    assert dropped.state is ReceiveState.ABANDONED
    assert events[-1:] == ["abandon:abandoning"]
    assert len([e for e in events if e.startswith("abandon")]) == 1
    with pytest.raises(IllegalTransitionError):
        dropped.complete()

    racing = Receive("o", on_complete=lambda r: r.fault("storage failed while completing"))
    racing.complete()
    assert racing.state is ReceiveState.FAULTED


def test_state_classes_evolve_with_defaults() -> None:
    @dataclasses.dataclass
    class V1:
        count: int = 0

    @dataclasses.dataclass
    class V2:
        count: int = 0
        label: str = "new"

    @dataclasses.dataclass
    class V3:
        label: str

    def make(state_type: type) -> Handler[Any]:
        return handler("Evolving", state_type)(lambda s, m, c: None)

    old = make(V1).encode_state(V1(count=4))
    assert make(V2).decode_state(old) == V2(count=4, label="new")
    assert make(V1).decode_state(make(V2).encode_state(V2(5, "x"))) == V1(count=5)
    with pytest.raises(ValueError, match=r"lacks \['label'\], which have no default"):
        make(V3).decode_state(old)


def test_handler_declaration_checks() -> None:
    with pytest.raises(ValueError, match="identifier"):
        handler("bad name")
    with pytest.raises(TypeError, match="dataclass"):
        handler("H", int)
    assert shooting_range.accepts("FireAt")
    assert not shooting_range.accepts("Hit")
    assert shooting_range.initial_state() == ShootingRange()
    with pytest.raises(TypeError, match="returned a int, not a ShootingRange"):
        shooting_range.encode_state(5)  # type: ignore[arg-type]
