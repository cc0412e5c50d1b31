"""The chaos harness on a real queue: Azurite's Queue service is the broker.

A producer sends the ledger workload to a queue for ``duration`` seconds,
each message one to three times (the later copies seconds apart), and a few
texts that are not messages. Worker processes consume it with
:class:`QueueConsumer` and publish outputs to an output queue; their locks
are short, some handler runs outlast them (half the workers do not renew),
the coordinator kills a worker by its PID every few seconds and starts
another, and Azurite (tables and queues, kept on disk) restarts midway.

When the input queue is empty, the oracle reads storage and both queues:

- each key's stored versions are distinct messages that were sent to it,
  and the serial fold of them, in the order stored, gives each version's
  state (the ledger's hash chain catches a lost, doubled or reordered one);
- the output queue holds exactly the outputs of the stored messages, every
  copy of one id identical to the model's output;
- every message sent and not stored, and every text that is not a message,
  is in the poison queue with a reason; nothing is left on the input queue.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from azure.core.exceptions import AzureError
from azure.storage.queue import QueueServiceClient

from azurite.launcher import AzuriteTable
from handlers import InMemoryPublisher, Message, PoisonEntry, Processor, encode_envelope
from handlers import read_queue_text as read_text
from streamstone_py import WireTableClient
from tests.helpers import drain

from .ledger import fold, ledger

__all__ = ["QueueChaosConfig", "QueueReport", "run_queue"]


@dataclass(frozen=True)
class QueueChaosConfig:
    seed: int = 1
    duration: float = 60.0
    processes: int = 2
    keys: int = 12
    #: Azurite restarts, spread over the sending.
    restarts: int = 2
    #: Seconds between worker kills.
    kill_every: float = 4.0
    #: The consumers' lock, in seconds.
    visibility: int = 2
    #: Messages sent per second.
    rate: float = 40.0
    #: Most seconds to wait for the input queue to empty after the sending.
    settle: float = 300.0


@dataclass
class QueueReport:
    seconds: float = 0.0
    messages: int = 0
    copies: int = 0
    garbage: int = 0
    stored: int = 0
    outputs: int = 0
    output_copies: int = 0
    poisoned: int = 0
    poisoned_stored: int = 0
    kills: int = 0
    restarts: int = 0
    #: What the workers that stopped gracefully counted (killed ones cannot tell).
    consumers: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)

    def table(self) -> str:
        rows = [
            ("seconds", f"{self.seconds:.1f}"),
            ("messages (distinct)", f"{self.messages}"),
            ("queue messages sent (copies)", f"{self.copies}"),
            ("texts that are not messages", f"{self.garbage}"),
            ("messages stored", f"{self.stored}"),
            ("outputs (distinct / copies on the queue)", f"{self.outputs} / {self.output_copies}"),
            ("poison entries", f"{self.poisoned}"),
            ("  of them for a stored message (crashed receives)", f"{self.poisoned_stored}"),
            ("workers killed", f"{self.kills}"),
            *(
                (f"  stopped workers' {name.replace('_', ' ')}", f"{self.consumers[name]}")
                for name in ("lost_locks", "renewed", "abandoned", "faulted", "duplicates")
            ),
            ("Azurite restarts", f"{self.restarts}"),
            ("violations", f"{len(self.violations)}"),
        ]
        width = max(len(name) for name, _ in rows)
        lines = [f"{name:<{width}}  {value}" for name, value in rows]
        return "\n".join(lines + [f"  VIOLATION: {v}" for v in self.violations])


def _message(picks: random.Random, n: int, keys: list[str]) -> Message:
    kind = picks.choices(["Deposit", "Withdraw", "Audit", "StrictWithdraw"], [45, 30, 15, 10])[0]
    return Message(f"q-{n}", picks.choice(keys), kind, {"amount": picks.randint(1, 100)})


def _patiently(action: Any, *args: Any, **kwargs: Any) -> Any:
    """``action`` until it succeeds: the coordinator's own calls ride out restarts."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return action(*args, **kwargs)
        except AzureError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


class _Workers:
    def __init__(self, config: QueueChaosConfig, env: dict[str, str], args: list[str]) -> None:
        self.config, self.env, self.args = config, env, args
        self.made = 0
        self.running: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        renew = self.made % 2  # half the workers never renew their locks
        command = [sys.executable, "-m", "tests.chaos.queue_worker", *self.args,
                   str(self.config.seed * 1000 + self.made), str(renew),
                   str(self.config.visibility)]  # fmt: skip
        self.running.append(subprocess.Popen(command, env=self.env))
        self.made += 1

    def kill_one(self, picks: random.Random) -> None:
        victim = self.running.pop(picks.randrange(len(self.running)))
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        self.start()

    def stop(self) -> None:
        for worker in self.running:
            worker.send_signal(signal.SIGTERM)
        for worker in self.running:
            try:
                worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()


def run_queue(config: QueueChaosConfig) -> QueueReport:
    """One run of the queue mode; its figures and violations."""
    report = QueueReport()
    picks = random.Random(config.seed)
    tag = uuid.uuid4().hex[:8]
    table_name, in_name, out_name = f"chaosq{tag}", f"chaos-{tag}", f"chaos-{tag}-out"
    keys = [f"acct-{n}" for n in range(config.keys)]
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as data, AzuriteTable(location=data, queues=True) as azurite:
        connection = azurite.connection_string
        service = QueueServiceClient.from_connection_string(connection)
        queue = service.create_queue(in_name)
        service.create_queue(out_name)
        table = WireTableClient.from_connection_string(connection, table_name)
        table.create_table()
        stats_file = os.path.join(data, "consumer-stats.jsonl")
        env = {**os.environ, "STREAMSTONE_CONNECTION_STRING": connection,
               "CHAOS_STATS": stats_file}  # fmt: skip
        workers = _Workers(config, env, [table_name, in_name, out_name])
        for _ in range(config.processes):
            workers.start()
        sent: dict[str, Message] = {}
        garbage: set[str] = set()
        later: list[tuple[float, str]] = []  # (when, text): copies sent seconds apart
        restarts_at = [
            started + config.duration * (n + 1) / (config.restarts + 1)
            for n in range(config.restarts)
        ]
        next_kill = started + config.kill_every
        n = 0
        try:
            while (now := time.monotonic()) < started + config.duration or later:
                if now < started + config.duration:
                    if picks.random() < 0.01:
                        text = f"garbage {n}: not a message"
                        garbage.add(text)
                        _patiently(queue.send_message, text)
                    message = _message(picks, n, keys)
                    n += 1
                    sent[message.id] = message
                    text = base64.b64encode(encode_envelope(message).encode()).decode()
                    _patiently(queue.send_message, text)
                    report.copies += 1
                    for _ in range(picks.choices([0, 1, 2], [70, 20, 10])[0]):
                        later.append((now + picks.uniform(0.5, 8.0), text))
                for when, text in [c for c in later if c[0] <= now]:
                    _patiently(queue.send_message, text)
                    report.copies += 1
                    later.remove((when, text))
                if restarts_at and now >= restarts_at[0]:
                    restarts_at.pop(0)
                    azurite.restart()
                    report.restarts += 1
                if now >= next_kill:
                    workers.kill_one(picks)
                    report.kills += 1
                    next_kill = now + config.kill_every
                time.sleep(1 / config.rate)
            deadline = time.monotonic() + config.settle
            while _patiently(queue.get_queue_properties).approximate_message_count:
                if time.monotonic() > deadline:
                    report.violations.append("the input queue did not empty in time")
                    break
                time.sleep(1)
        finally:
            workers.stop()
        with contextlib.suppress(FileNotFoundError), open(stats_file) as lines:
            for line in lines:
                report.consumers.update(json.loads(line))
        report.messages, report.garbage = len(sent), len(garbage)
        _check(report, sent, garbage, table, service, in_name, out_name)
        table.close()
    report.seconds = time.monotonic() - started
    return report


def _check(
    report: QueueReport,
    sent: dict[str, Message],
    garbage: set[str],
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
            if entry.content in garbage:
                poisoned.add(entry.content)
                continue
            message_id = read_text(entry.content).id
            poisoned.add(message_id)
            report.poisoned_stored += message_id in stored
    lost = sorted(set(sent) - stored - poisoned)
    if lost:
        violations.append(f"sent, neither stored nor poisoned: {lost[:10]} ({len(lost)})")
    if garbage - poisoned:
        violations.append(
            f"texts that are not messages, not poisoned: {sorted(garbage - poisoned)}"
        )
    left = drain(service.get_queue_client(in_name))
    if left:
        violations.append(f"{len(left)} queue messages left on the input queue")
