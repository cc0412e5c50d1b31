"""The oracle: what must hold after the chaos settles, checked from storage and publications.

It takes what was stored (each key's stream: the message id and state of
every version, the header's state, the outbox rows), what was published (every
publication, repeats included) and what the workers reported, and compares
them with :func:`ledger.fold`, the serial fault-free run of each key's
distinct messages in the order they were first stored. The reported versions
must agree with that order, so it is also the order of first successful
processing.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from handlers import Message

from .ledger import fold


@dataclass
class StoredKey:
    """One key's stream as read back after the run."""

    header_state: bytes | None = None
    events: list[tuple[int, str, bytes]] = field(default_factory=list)  # version, id, state
    outbox: dict[str, bool] = field(default_factory=dict)  # message id -> dispatched


def check(
    messages: Mapping[str, Message],
    stored: Mapping[str, StoredKey],
    published: Iterable[bytes],
    reported: Mapping[str, set[int | None]],
    outbox_keys: Iterable[str] = (),
) -> list[str]:
    """Every violation found, as ``"kind: detail"``; an empty list is a pass."""
    violations: list[str] = []
    by_key: dict[str, list[Message]] = defaultdict(list)
    for message in messages.values():
        by_key[message.key].append(message)
    expected: dict[str, bytes] = {}
    for key in sorted(set(by_key) | set(stored)):
        found = stored.get(key, StoredKey())
        violations += _check_key(key, by_key.get(key, []), found, messages, reported, expected)
    outbox = set(outbox_keys)
    for key, found in sorted(stored.items()):
        ids = {message_id for _, message_id, _ in found.events}
        if key in outbox and set(found.outbox) != ids:
            violations.append(f"zombie: outbox rows of {key!r} do not match its stored versions")
        for message_id, dispatched in sorted(found.outbox.items()):
            if not dispatched:
                violations.append(f"zombie: outputs of {message_id!r} never marked dispatched")
    seen: set[str] = set()
    for data in published:
        output = Message.decode(data)
        want = expected.get(output.id)
        if want is None:
            violations.append(f"ghost: output {output.id!r} ({output.type}) has no stored cause")
        elif want != data:
            violations.append(f"divergent: output {output.id!r} differs from the expected one")
        seen.add(output.id)
    for output_id in sorted(set(expected) - seen):
        violations.append(f"zombie: expected output {output_id!r} was never published")
    return violations


def _check_key(
    key: str,
    delivered: list[Message],
    found: StoredKey,
    messages: Mapping[str, Message],
    reported: Mapping[str, set[int | None]],
    expected: dict[str, bytes],
) -> list[str]:
    violations = []
    counts = Counter(message_id for _, message_id, _ in found.events)
    for message in delivered:
        if counts[message.id] == 0:
            violations.append(f"lost: {message.id!r} of {key!r} changed no state")
        if not reported.get(message.id):
            violations.append(f"lost: {message.id!r} of {key!r} never got a successful outcome")
    for message_id, n in sorted(counts.items()):
        if n > 1:
            violations.append(f"double: {message_id!r} of {key!r} is stored {n} times")
        if message_id not in messages or messages[message_id].key != key:
            violations.append(f"foreign: {message_id!r} is stored in {key!r}")
    versions = [version for version, _, _ in found.events]
    if versions != list(range(1, len(versions) + 1)):
        violations.append(f"gap: versions of {key!r} are not 1..{len(versions)}")
    order = [messages[m] for _, m, _ in found.events if m in messages]
    for version, message_id, _ in found.events:
        wrong = {v for v in reported.get(message_id, set()) if v is not None and v != version}
        if wrong:
            violations.append(
                f"order: {message_id!r} is version {version} of {key!r}, reported as {wrong}"
            )
    steps = fold(order)
    for (version, message_id, state), (want, outputs) in zip(found.events, steps, strict=False):
        if state != want:
            violations.append(f"state: version {version} ({message_id!r}) of {key!r} differs")
        for output in outputs:
            expected[output.id] = output.encode()
    final = steps[-1][0] if steps else None
    if found.header_state != final:
        violations.append(f"state: the newest state of {key!r} differs from the serial fold")
    return violations
