"""The determinism check behind :func:`handlers.testing.check_handler`.

A duplicate is handled again on the state just before its original, with the
original's clock and captures, possibly in another process: the handler must
give the same state and the same outputs there. The check runs every message
that way, in this process and in subprocesses with other string-hash seeds,
and compares everything the runtime would compare, field by field.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from ._context import HandlerContext
from ._handler import Handler
from ._messages._codec import pack, unpack
from ._messages._message import Message, without_trace

__all__ = ["Difference", "HandlerReport", "check_handler"]

#: Shown for a field that one run has and the other has not.
ABSENT: Final = "<absent>"
#: The string-hash seeds of the subprocess runs by default.
HASH_SEEDS: Final = (1, 2, 3)


@dataclass(frozen=True, slots=True)
class Difference:
    """One field in which two runs of the same message on the same state differ."""

    message_id: str
    #: Which run differs from the first: ``"second run"`` or ``"PYTHONHASHSEED=N"``.
    run: str
    #: Where, e.g. ``state['players'][0]`` or ``outputs[1].body['id']``.
    path: str
    first: Any
    second: Any

    def __str__(self) -> str:
        return f"{self.message_id} ({self.run}): {self.path}: {self.first!r} != {self.second!r}"


@dataclass(frozen=True, slots=True)
class HandlerReport:
    """What :func:`check_handler` found. ``ok`` when no run differed."""

    handler: str
    messages: int
    #: The seeds the subprocess runs used (empty: none ran).
    hash_seeds: tuple[int, ...]
    differences: tuple[Difference, ...]
    #: Messages on which the handler raised in every run: ``(message id, error)``.
    #: Not a determinism problem, but such a message is abandoned in a pipeline.
    failures: tuple[tuple[str, str], ...]

    @property
    def deterministic(self) -> bool:
        """No run differed from the first (a message that raised in every run
        raised the same error each time)."""
        return not self.differences

    @property
    def ok(self) -> bool:
        """Deterministic, and the handler handled every message it was given:
        a message it raises on is abandoned in a pipeline, delivery after
        delivery, so it is a finding too."""
        return not self.differences and not self.failures

    def __str__(self) -> str:
        runs = "twice in this process"
        if self.hash_seeds:
            runs += " and once per PYTHONHASHSEED in " + ", ".join(map(str, self.hash_seeds))
        head = f"handler {self.handler!r}: {_count(self.messages, 'message')}, each {runs}: "
        raised = len(self.failures)
        if raised and raised == self.messages:
            head += f"raised on every message ({raised} of {raised}), so nothing was compared"
        else:
            head += (
                "deterministic"
                if self.deterministic
                else _count(len(self.differences), "difference")
            )
            if raised:
                head += f"; raised on {raised} of {_count(self.messages, 'message')}"
        lines = [head, *(f"  {d}" for d in self.differences)]
        lines += [f"  {m}: raised in every run: {e}" for m, e in self.failures]
        if raised:
            lines.append("  (a message the handler raises on is abandoned in a pipeline)")
        return "\n".join(lines)

    def raise_for_differences(self, *, allow_failures: bool = False) -> None:
        """Raise ``AssertionError`` listing every difference, and every message
        the handler raised on unless ``allow_failures`` (a test that feeds it
        messages it must refuse); nothing when ``ok``."""
        if self.differences or (self.failures and not allow_failures):
            raise AssertionError(str(self))


@dataclass(frozen=True, slots=True)
class _Run:
    """One handling of a message: the state after it and its outputs, as plain data."""

    state: Any
    outputs: list[Any]
    error: str | None


def _handle(
    handler: Handler[Any],
    state: bytes,
    message: Message,
    now: datetime,
    captures: dict[str, Any] | None,
) -> tuple[_Run, bytes, dict[str, Any]]:
    """Handle ``message`` on a fresh decoding of ``state`` in a fresh context.

    With ``captures`` it is a replay, as a duplicate is: the recorded values
    are given back and a capture that was not taken the first time fails.
    """
    context = HandlerContext(
        message,
        handler=handler.name,
        now=now,
        captures=captures,
        replay=captures is not None,
    )
    try:
        after = handler.encode_state(handler.apply(handler.decode_state(state), message, context))
    except Exception as exc:  # any failure is a result to compare
        return _Run(None, [], f"{type(exc).__name__}: {exc}"), state, context.captures
    outputs = [_output(o) for o in context.outputs]
    return _Run(unpack(after), outputs, None), after, context.captures


def _output(message: Message) -> dict[str, Any]:
    return {
        "id": message.id,
        "key": message.key,
        "type": message.type,
        "body": unpack(pack(message.body)),
        # Trace headers are how it travelled, not what it is (see Message.identity).
        "headers": dict(sorted(without_trace(message.headers).items())),
        "due": None if message.due is None else message.due.isoformat(),
    }


def _compare(path: str, first: Any, second: Any) -> Iterable[tuple[str, Any, Any]]:
    """Every leaf where two plain values differ, with its path."""
    if isinstance(first, dict) and isinstance(second, dict):
        for name in sorted({*first, *second}):
            yield from _compare(
                f"{path}[{name!r}]", first.get(name, ABSENT), second.get(name, ABSENT)
            )
    elif isinstance(first, list) and isinstance(second, list):
        if len(first) != len(second):
            yield f"{path} length", len(first), len(second)
        for i, (a, b) in enumerate(zip(first, second, strict=False)):
            yield from _compare(f"{path}[{i}]", a, b)
    elif pack(first) != pack(second):  # as stored: NaN equals itself, 1 differs from 1.0
        yield path, first, second


def _differences(message_id: str, run: str, first: _Run, other: _Run) -> list[Difference]:
    if first.error is not None or other.error is not None:
        if first.error == other.error:
            return []
        return [Difference(message_id, run, "raised", first.error, other.error)]
    found = list(_compare("state", first.state, other.state))
    if len(first.outputs) != len(other.outputs):
        found.append(("outputs length", len(first.outputs), len(other.outputs)))
    for i, (a, b) in enumerate(zip(first.outputs, other.outputs, strict=False)):
        for name in ("id", "key", "type", "body", "headers", "due"):
            found.extend(_compare(f"outputs[{i}].{name}", a[name], b[name]))
    return [Difference(message_id, run, path, a, b) for path, a, b in found]


def _spec_of(handler: Handler[Any]) -> str | None:
    """``module:attribute`` under which another process imports this handler."""
    fn = getattr(handler, "_fn", None)
    module_name = getattr(fn, "__module__", None) or type(handler).__module__
    module = sys.modules.get(module_name)
    if module is None or module_name == "__main__":
        return None
    for attribute, value in vars(module).items():
        if value is handler:
            return f"{module_name}:{attribute}"
    return None


def _resolve(spec: str) -> Handler[Any]:
    module_name, _, attribute = spec.partition(":")
    found = getattr(importlib.import_module(module_name), attribute, None)
    if not isinstance(found, Handler):
        raise ValueError(f"{spec!r} is not a handlers.Handler")
    return found


def _in_subprocess(spec: str, seed: int, steps: list[Any]) -> list[_Run]:
    """The replays of ``steps`` in a fresh interpreter with ``PYTHONHASHSEED=seed``."""
    env = {**os.environ, "PYTHONHASHSEED": str(seed)}
    # The child imports what this process can: the handler may live in a test tree.
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    done = subprocess.run(
        [sys.executable, "-m", "handlers._determinism"],
        input=pack({"spec": spec, "steps": steps}),
        capture_output=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"the check's subprocess (PYTHONHASHSEED={seed}) failed:\n"
            + done.stderr.decode(errors="replace")
        )
    return [_Run(state, outputs, error) for state, outputs, error in unpack(done.stdout)]


def check_handler(
    handler: Handler[Any],
    messages: Iterable[Message],
    *,
    hash_seeds: Sequence[int] = HASH_SEEDS,
    spec: str | None = None,
) -> HandlerReport:
    """Handle each message twice on the same state, and report every difference.

    The messages are applied in order from the initial state, as one key's
    history (messages of several keys are fine: each key has its own state).
    Each message is handled on the state its predecessors left, first as the
    original, then again as a duplicate would be: in a fresh context with the
    original's clock and captures. Both runs must give the same state and the
    same outputs, field by field. That catches ``uuid4``, ``time.time()``,
    the order of a set of objects, and any state kept outside the handler.

    Strings hash differently in every process unless ``PYTHONHASHSEED`` is
    set, so the order of a set of strings is the same within one process and
    differs in another. Each seed in ``hash_seeds`` runs the replays once
    more in a subprocess with that seed; pass ``()`` to skip them. The
    subprocess imports the handler as ``spec`` (``"package.module:name"``),
    found by itself when the handler is a module attribute.
    """
    if not isinstance(handler, Handler):
        raise TypeError(f"handler must be a handlers.Handler, got {handler!r}")
    seeds = tuple(hash_seeds)
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
        raise ValueError(f"hash_seeds must be ints >= 0, got {hash_seeds!r}")
    if seeds and spec is None:
        spec = _spec_of(handler)
        if spec is None:
            raise ValueError(
                f"handler {handler.name!r} is not an attribute of an importable module, "
                "so a subprocess cannot load it: pass spec='package.module:name', "
                "or hash_seeds=() to check in this process only"
            )
    states: dict[str, bytes] = {}
    now = datetime.now(UTC)
    ids: list[str] = []
    firsts: list[_Run] = []
    steps: list[Any] = []
    differences: list[Difference] = []
    for message in messages:
        if not isinstance(message, Message):
            raise TypeError(f"messages must be handlers.Message, got {message!r}")
        if not handler.accepts(message.type):
            raise ValueError(
                f"message {message.id!r} has type {message.type!r}, "
                f"which handler {handler.name!r} does not accept"
            )
        if message.key in states:
            before = states[message.key]
        else:
            before = handler.encode_state(handler.initial_state())
        first, after, taken = _handle(handler, before, message, now, None)
        # A failed message is not stored: the next delivery handles it afresh.
        captures = taken if first.error is None else None
        second, _, _ = _handle(handler, before, message, now, captures)
        differences += _differences(message.id, "second run", first, second)
        states[message.key] = after
        ids.append(message.id)
        firsts.append(first)
        steps.append([message.encode(), before, now.isoformat(), captures])
    for seed in seeds:
        assert spec is not None
        for message_id, first, other in zip(
            ids, firsts, _in_subprocess(spec, seed, steps), strict=True
        ):
            differences += _differences(message_id, f"PYTHONHASHSEED={seed}", first, other)
    failures = tuple(
        (message_id, run.error) for message_id, run in zip(ids, firsts, strict=True) if run.error
    )
    return HandlerReport(handler.name, len(ids), seeds, tuple(differences), failures)


def _child() -> None:
    """The subprocess: replay each step, write the results as msgpack."""
    job = unpack(sys.stdin.buffer.read())
    handler = _resolve(job["spec"])
    results = []
    for encoded, before, now, captures in job["steps"]:
        message = Message.decode(encoded)
        run, _, _ = _handle(handler, before, message, datetime.fromisoformat(now), captures)
        results.append([run.state, run.outputs, run.error])
    sys.stdout.buffer.write(pack(results))


if __name__ == "__main__":
    _child()


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
