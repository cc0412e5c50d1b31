"""The oracle of the queue chaos mode: what storage and both queues must
hold once the input queue is empty.

- each key's stored versions are distinct messages that were sent to it,
  and the serial fold of them, in the order stored, gives each version's
  state (the ledger's hash chain catches a lost, doubled or reordered one);
- the output queue holds exactly the outputs of the stored messages, every
  copy of one id identical to the model's output;
- every message sent and not stored, and every hostile text, is in the
  poison queue with a reason; a valid message is there only if its handler
  failed on it on every receive (never for a storage outage, a restart or a
  key-mate), and nothing is left on the input queue.
"""

from __future__ import annotations

import contextlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Final

from azure.core.exceptions import AzureError
from azure.storage.queue import QueueServiceClient

from handlers import InMemoryPublisher, Message, PoisonEntry, Processor
from handlers import read_queue_text as read_text
from tests.helpers import drain

from .ledger import HANDLER, fold, ledger

__all__ = ["QueueReport", "check"]

#: What a poison entry's reason says when the ledger's handler raised.
HANDLER_FAILED: Final = f"handler {HANDLER!r} failed on message"


#: The stopped workers' figures the report shows.
_COUNTED: Final = ("lost_locks", "renewed", "abandoned", "faulted", "duplicates", "outages")


@dataclass
class QueueReport:
    seconds: float = 0.0
    messages: int = 0
    copies: int = 0
    hostile: int = 0
    stored: int = 0
    outputs: int = 0
    output_copies: int = 0
    poisoned: int = 0
    poisoned_stored: int = 0
    #: Valid messages poisoned because their handler failed on them every time.
    poisoned_by_handler: int = 0
    kills: int = 0
    restarts: int = 0
    outages: int = 0
    #: What the workers that stopped gracefully counted (killed ones cannot tell).
    consumers: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)

    def table(self) -> str:
        rows = [
            ("seconds", f"{self.seconds:.1f}"),
            ("messages (distinct)", f"{self.messages}"),
            ("queue messages sent (copies)", f"{self.copies}"),
            ("hostile texts (not messages)", f"{self.hostile}"),
            ("messages stored", f"{self.stored}"),
            ("outputs (distinct / copies on the queue)", f"{self.outputs} / {self.output_copies}"),
            ("poison entries", f"{self.poisoned}"),
            ("  of them for a stored message (crashed receives)", f"{self.poisoned_stored}"),
            ("  of them a valid message its handler failed on", f"{self.poisoned_by_handler}"),
            ("workers killed", f"{self.kills}"),
            *(
                (f"  stopped workers' {name.replace('_', ' ')}", f"{self.consumers[name]}")
                for name in _COUNTED
            ),
            ("Azurite restarts", f"{self.restarts}"),
            ("Table service outages", f"{self.outages}"),
            ("violations", f"{len(self.violations)}"),
        ]
        width = max(len(name) for name, _ in rows)
        lines = [f"{name:<{width}}  {value}" for name, value in rows]
        return "\n".join(lines + [f"  VIOLATION: {v}" for v in self.violations])


def check(
    report: QueueReport,
    sent: dict[str, Message],
    hostile: dict[str, str],
    told: list[dict[str, Any]],
    table: Any,
    service: QueueServiceClient,
    in_name: str,
    out_name: str,
) -> None:
    violations = report.violations
    reader = Processor(ledger, table, InMemoryPublisher())
    by_key: dict[str, list[Message]] = defaultdict(list)
    for message in sent.values():
        by_key[message.key].append(message)
    stored: set[str] = set()
    expected: dict[str, Message] = {}
    for key in sorted(by_key):
        versions = list(reader.history(key))
        ids = [v.message_id for v in versions]
        if [v.version for v in versions] != list(range(1, len(versions) + 1)):
            violations.append(f"{key}: versions {[v.version for v in versions]} are not 1..n")
        doubled = [i for i, c in Counter(ids).items() if c > 1]
        if doubled:
            violations.append(f"{key}: stored twice: {doubled}")
        strangers = [i for i in ids if i not in sent or sent[i].key != key]
        if strangers:
            violations.append(f"{key}: stored messages never sent to it: {strangers}")
            continue
        steps = fold([sent[i] for i in ids])
        for version, step in zip(versions, steps, strict=True):
            if step.failure is not None:
                violations.append(f"{key} v{version.version}: stored, but fails: {step.failure}")
            elif ledger.encode_state(version.state) != step.state:
                violations.append(f"{key} v{version.version}: state differs from the model")
            for output in step.outputs:
                expected[output.id] = output
        stored.update(ids)
    report.stored = len(stored)

    copies: dict[str, set[str]] = defaultdict(set)
    texts = drain(service.get_queue_client(out_name))
    report.output_copies = len(texts)
    for text in texts:
        output = read_text(text)
        copies[output.id].add(text)
        if expected.get(output.id) != output:
            violations.append(f"output {output.id} is not the model's: {output}")
    report.outputs = len(copies)
    violations += [f"output {i} has copies that differ" for i, c in copies.items() if len(c) > 1]
    missing = sorted(set(expected) - set(copies))
    if missing:
        violations.append(f"outputs of stored messages never published: {missing[:5]}")

    poisoned: set[str] = set()
    with contextlib.suppress(AzureError):
        for text in drain(service.get_queue_client(f"{in_name}-poison")):
            entry = PoisonEntry.decode(text)
            report.poisoned += 1
            if not entry.reason:
                violations.append(f"poison entry without a reason: {entry}")
            if entry.content in hostile:
                poisoned.add(entry.content)
                continue
            message_id = read_text(entry.content).id
            poisoned.add(message_id)
            report.poisoned_stored += message_id in stored
            # A valid message is shelved only for what its handler did, every time.
            if _handler_failed(entry, told):
                report.poisoned_by_handler += 1
            else:
                kind = sent[message_id].type if message_id in sent else "?"
                seen = [(t["action"], t["receive"], t["reason"]) for t in told
                        if t["id"] == message_id]  # fmt: skip
                violations.append(
                    f"valid message {message_id} ({kind}) poisoned: {entry.reason}; told {seen}"
                )
    lost = sorted(set(sent) - stored - poisoned)
    if lost:
        violations.append(f"sent, neither stored nor poisoned: {lost[:10]} ({len(lost)})")
    for text, form in hostile.items():
        if text not in poisoned:
            violations.append(f"a hostile text ({form}) not poisoned: {text[:80]!r}")
    left = drain(service.get_queue_client(in_name))
    if left:
        violations.append(f"{len(left)} queue messages left on the input queue")


def _handler_failed(entry: PoisonEntry, told: list[dict[str, Any]]) -> bool:
    """Whether the message was poisoned for what its handler did: it failed on
    its last allowed receive; or, poisoned for being received too often, its
    handler failed on every receive that ran it (the workers tell each as it
    happens; a receive kept through an outage ran nothing), so the receives
    it lacks were lost to killed workers, which the rule that stops a message
    killing its worker counts by design."""
    if entry.reason.startswith("failed on receive"):
        return HANDLER_FAILED in entry.reason
    message_id = read_text(entry.content).id
    ran = [
        t for t in told
        if t["id"] == message_id and t["action"] != "poisoned"
        and not (t["action"] == "faulted" and str(t["reason"]).startswith("kept until storage"))
    ]  # fmt: skip
    return bool(ran) and all(
        t["action"] == "abandoned" and HANDLER_FAILED in (t["reason"] or "") for t in ran
    )
