"""The chaos harness on a real queue: Azurite's Queue service is the broker.

A producer sends the ledger workload to a queue for ``duration`` seconds,
each message one to three times (the later copies seconds apart), and
hostile texts among them (``tests.hostile_texts``: not JSON, fields of the
wrong type, dates out of the calendar, lone surrogates, huge numbers, deep
nesting, bad markers, keys the table cannot store...). Worker processes
consume it with :class:`QueueConsumer` and publish outputs to an output
queue; their locks are short, some handler runs outlast them (half the
workers do not renew), the coordinator kills a worker by its PID every few
seconds and starts another, the Table service alone stops for a while (an
outage: the Queue service runs on), and Azurite (tables and queues, kept on
disk) restarts midway.

When the input queue is empty, the oracle (``queue_oracle``) reads storage
and both queues.
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
from dataclasses import dataclass
from typing import Any

from azure.core.exceptions import AzureError
from azure.storage.queue import QueueServiceClient

from azurite.launcher import AzuriteTable
from handlers import Message, encode_envelope
from streamstone_py import WireTableClient
from tests.hostile_texts import HOSTILE

from .queue_oracle import QueueReport, check

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
    #: Share of the texts sent that are hostile (not messages).
    hostile: float = 0.02
    #: Outages of the Table service alone, spread over the sending, and their length.
    outages: int = 1
    outage_seconds: float = 10.0


def _message(picks: random.Random, n: int, keys: list[str]) -> Message:
    kind = picks.choices(["Deposit", "Withdraw", "Audit", "StrictWithdraw"], [45, 30, 15, 10])[0]
    return Message(f"q-{n}", picks.choice(keys), kind, {"amount": picks.randint(1, 100)})


def _spread(start: float, duration: float, count: int) -> list[float]:
    """``count`` instants spread evenly over ``duration`` seconds from ``start``."""
    return [start + duration * (n + 1) / (count + 1) for n in range(count)]


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
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as data, AzuriteTable(location=data, queues=True) as azurite:
        connection = azurite.connection_string
        service = QueueServiceClient.from_connection_string(connection)
        queue = service.create_queue(in_name)
        service.create_queue(out_name)
        table = WireTableClient.from_connection_string(connection, table_name)
        table.create_table()
        stats_file = os.path.join(data, "consumer-stats.jsonl")
        outcomes_file = os.path.join(data, "consumer-outcomes.jsonl")
        env = {**os.environ, "STREAMSTONE_CONNECTION_STRING": connection,
               "CHAOS_STATS": stats_file, "CHAOS_OUTCOMES": outcomes_file}  # fmt: skip
        workers = _Workers(config, env, [table_name, in_name, out_name])
        for _ in range(config.processes):
            workers.start()
        sent: dict[str, Message] = {}
        hostile: dict[str, str] = {}  # text: how it breaks
        later: list[tuple[float, str]] = []  # (when, text): copies sent seconds apart
        # The sending's clock starts once everything is up: on a loaded machine
        # Azurite and the workers' start may take longer than a short run sends.
        started = time.monotonic()
        restarts_at = _spread(started, config.duration, config.restarts)
        outages_at = _spread(started + config.duration / 8, config.duration, config.outages)
        outage_ends: float | None = None
        next_kill = started + config.kill_every
        n = 0
        try:
            while (now := time.monotonic()) < started + config.duration or later:
                if now < started + config.duration:
                    if picks.random() < config.hostile:
                        form = picks.choice(sorted(HOSTILE))
                        text = HOSTILE[form](picks, picks.choice(keys))
                        hostile[text] = form
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
                if outages_at and now >= outages_at[0] and outage_ends is None:
                    outages_at.pop(0)
                    azurite.stop("table")  # the Queue service runs on
                    outage_ends = now + config.outage_seconds
                    report.outages += 1
                elif outage_ends is not None and now >= outage_ends:
                    azurite.start("table")
                    outage_ends = None
                elif restarts_at and now >= restarts_at[0] and outage_ends is None:
                    restarts_at.pop(0)
                    azurite.restart()
                    report.restarts += 1
                if now >= next_kill:
                    workers.kill_one(picks)
                    report.kills += 1
                    next_kill = now + config.kill_every
                time.sleep(1 / config.rate)
            if outage_ends is not None:
                azurite.start("table")
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
        report.messages, report.hostile = len(sent), len(hostile)
        with contextlib.suppress(FileNotFoundError), open(outcomes_file) as lines:
            told = [json.loads(line) for line in lines if line.endswith("\n")]
        check(report, sent, hostile, told, table, service, in_name, out_name)
        table.close()
    report.seconds = time.monotonic() - began
    return report
