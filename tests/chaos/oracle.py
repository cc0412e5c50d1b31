"""The oracle: what must hold after the chaos settles, checked from storage and publications.

It takes what was stored (each key's stream: the message id and state of
every version, the header's state, the outbox rows, and the versions seen
before retention removed them), what was published (every publication,
repeats included) and what the workers reported, and compares them with
:func:`ledger.fold`, the serial fault-free run of each key's distinct
messages in the order they were first stored. The reported versions must
agree with that order, so it is also the order of first successful
processing.

Retention removes old versions, so the coordinator reads each key's versions
before it asks for a retain (every version that retain may remove is
committed by then: see the harness); the history checked here is the union
of those reads and what is left. What retention may legitimately do is then
exactly this: versions absent at the end, and redeliveries refused as outside
the window. A refused message must have been stored. A message the harness
gave up on (its handler raised on every delivery) must never have been stored.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from handlers import Message
from handlers._messages._codec import digest, pack

from .ledger import fold, shared

#: Why a message may be given up without a violation: its handler raised.
HANDLER_FAILED = "HandlerFailedError"


@dataclass
class StoredKey:
    """One key's stream as read back after the run."""

    header_state: bytes | None = None
    events: list[tuple[int, str, bytes]] = field(default_factory=list)  # version, id, state
    outbox: dict[str, bool] = field(default_factory=dict)  # message id -> dispatched
    #: Versions read during the run, before retention could remove them.
    seen: dict[int, tuple[str, bytes]] = field(default_factory=dict)
    #: Rows retention should have removed and did not (event and id row keys).
    leftovers: list[str] = field(default_factory=list)
    #: The header's version, and the metadata the engine and the runtime keep
    #: beside each kept event: its id row's version, and its output digest.
    header_version: int | None = None
    id_rows: dict[str, int] = field(default_factory=dict)  # message id -> version
    digests: dict[int, str] = field(default_factory=dict)  # version -> Digest


@dataclass
class Fates:
    """Final outcomes that are not a success: refused duplicates, given-up messages."""

    refused: dict[str, str] = field(default_factory=dict)  # message id -> reason
    given_up: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (error, reason)


def check(
    messages: Mapping[str, Message],
    stored: Mapping[str, StoredKey],
    published: Iterable[bytes],
    reported: Mapping[str, set[int | None]],
    outbox_keys: Iterable[str] = (),
    fates: Fates | None = None,
) -> list[str]:
    """Every violation found, as ``"kind: detail"``; an empty list is a pass."""
    fates = fates or Fates()
    violations: list[str] = []
    by_key: dict[str, list[Message]] = defaultdict(list)
    for message in messages.values():
        by_key[message.key].append(message)
    expected: dict[str, bytes] = {}
    for key in sorted(set(by_key) | set(stored)):
        found = stored.get(key, StoredKey())
        violations += _check_key(
            key, by_key.get(key, []), found, messages, reported, fates, expected
        )
    outbox = set(outbox_keys)
    for key, found in sorted(stored.items()):
        ids = {message_id for _, message_id, _ in found.events}
        if key in outbox and set(found.outbox) != ids:
            violations.append(f"zombie: outbox rows of {key!r} do not match its stored versions")
        for message_id, dispatched in sorted(found.outbox.items()):
            if not dispatched:
                violations.append(f"zombie: outputs of {message_id!r} never marked dispatched")
        for row in found.leftovers:
            violations.append(f"zombie: {row!r} of {key!r} outlived the retention that removed it")
    seen: set[str] = set()
    for data in published:
        output = Message.decode(data)
        want = expected.get(output.id)
        if want is None:
            violations.append(f"ghost: output {output.id!r} ({output.type}) has no stored cause")
        elif want != output.identity():  # a trace's headers are transport, not the output
            violations.append(f"divergent: output {output.id!r} differs from the expected one")
        seen.add(output.id)
    for output_id in sorted(set(expected) - seen):
        violations.append(f"zombie: expected output {output_id!r} was never published")
    return violations


def _history(key: str, found: StoredKey) -> tuple[list[tuple[int, str, bytes]], list[str]]:
    """Every version ever seen (read during the run or left at the end), in order."""
    violations = []
    history = dict(found.seen)
    for version, message_id, state in found.events:
        earlier = history.get(version)
        if earlier is not None and earlier != (message_id, state):
            violations.append(f"rewritten: version {version} of {key!r} changed after it was read")
        history[version] = (message_id, state)
    return [(v, *history[v]) for v in sorted(history)], violations


def _check_key(
    key: str,
    delivered: list[Message],
    found: StoredKey,
    messages: Mapping[str, Message],
    reported: Mapping[str, set[int | None]],
    fates: Fates,
    expected: dict[str, bytes],
) -> list[str]:
    history, violations = _history(key, found)
    counts = Counter(message_id for _, message_id, _ in history)
    for message in delivered:
        given_up = fates.given_up.get(message.id)
        if counts[message.id] == 0:
            if message.id in fates.refused:
                violations.append(
                    f"lost: {message.id!r} of {key!r} was refused as outside the window "
                    f"but never stored ({fates.refused[message.id]})"
                )
            elif given_up is None or given_up[0] != HANDLER_FAILED:
                violations.append(f"lost: {message.id!r} of {key!r} changed no state")
            continue
        if given_up is not None:
            violations.append(
                f"stuck: {message.id!r} of {key!r} is stored, yet its redeliveries failed "
                f"until given up ({given_up[0]}: {given_up[1]})"
            )
        # A stored message may be refused without ever being acknowledged: its
        # worker died after publishing, and retention removed its version before
        # the redelivery. Its outputs are checked below like any other.
        if not reported.get(message.id) and message.id not in fates.refused:
            violations.append(f"lost: {message.id!r} of {key!r} never got a successful outcome")
    for message_id, n in sorted(counts.items()):
        if n > 1:
            violations.append(f"double: {message_id!r} of {key!r} is stored {n} times")
        if message_id not in messages or messages[message_id].key != key:
            violations.append(f"foreign: {message_id!r} is stored in {key!r}")
    versions = [version for version, _, _ in history]
    if versions != list(range(1, len(versions) + 1)):
        violations.append(f"gap: versions of {key!r} are not 1..{len(versions)}")
    order = [messages[m] for _, m, _ in history if m in messages]
    for version, message_id, _ in history:
        wrong = {v for v in reported.get(message_id, set()) if v is not None and v != version}
        if wrong:
            violations.append(
                f"order: {message_id!r} is version {version} of {key!r}, reported as {wrong}"
            )
    steps = fold(order)
    differ = []
    for (version, message_id, state), step in zip(history, steps, strict=False):
        if step.failure is not None:
            violations.append(
                f"state: version {version} ({message_id!r}) of {key!r} is stored, but the "
                f"serial fold raises there ({step.failure})"
            )
        if not _same(state, step.state):
            differ.append((version, message_id))
        for output in step.outputs:
            expected[output.id] = output.identity()
    violations += _check_metadata(key, found, history, steps)
    if differ:  # one wrong state makes every later one differ: name the first
        version, message_id = differ[0]
        violations.append(
            f"state: version {version} ({message_id!r}) of {key!r} differs"
            + (f", and {len(differ) - 1} versions after it" if len(differ) > 1 else "")
        )
    final = steps[-1].state if steps else None
    if not _same(found.header_state, final):
        violations.append(f"state: the newest state of {key!r} differs from the serial fold")
    return violations


def _check_metadata(
    key: str, found: StoredKey, history: list[tuple[int, str, bytes]], steps: list[Any]
) -> list[str]:
    """The rows beside the events: the header's version, id rows and output digests."""
    violations = []
    last = history[-1][0] if history else 0
    if found.header_version is not None and found.header_version != last:
        violations.append(
            f"metadata: the header of {key!r} says version {found.header_version}, "
            f"the last stored version is {last}"
        )
    digests = {
        version: digest(pack([o.identity() for o in step.outputs]))
        for (version, _, _), step in zip(history, steps, strict=False)
    }
    for version, message_id, _ in found.events:
        at = found.id_rows.get(message_id)
        if at != version:
            violations.append(
                f"metadata: the id row of {message_id!r} in {key!r} "
                + ("is missing" if at is None else f"points at version {at}")
                + f", its event is version {version}"
            )
        stored_digest = found.digests.get(version)
        if version in digests and stored_digest != digests[version]:
            violations.append(
                f"metadata: the output digest of version {version} of {key!r} "
                "differs from its outputs'"
            )
    return violations


def _same(stored: bytes | None, model: bytes | None) -> bool:
    """Equal on the fields both state versions share, and written by one of them."""
    if stored is None or model is None:
        return stored is model
    try:
        values, version = shared(stored)
    except Exception:  # not a state at all
        return False
    return version is not None and values == shared(model)[0]
