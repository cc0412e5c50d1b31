"""A worker: takes chunks of deliveries from the coordinator, processes them, acknowledges.

The same loop runs in a thread or in a separate process; it talks to the
coordinator over two one-way pipes. A crash (see :mod:`.injector`) ends the
chunk: the worker reports it, drops its processors as a restarted worker
would, and the coordinator redelivers what was not acknowledged. In a process
worker some crashes are real: the process exits on the spot.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from azure.data.tables import TableClient

from handlers import Message, Outcome, Processor
from streamstone_py import RetryPolicy

from .injector import CRASH_IN_HANDLER, ChaosStore, ChaosTransport, Crash, FilePublisher, Injector
from .ledger import HANDLER, hooks, ledger

#: Short pauses: the faults are frequent, and an Azurite restart takes a second or two.
RETRY = RetryPolicy(attempts=8, initial_delay=0.02, max_delay=0.5, total_time=15.0)


@dataclass(frozen=True)
class WorkerConfig:
    worker: int
    incarnation: int
    seed: int
    connection_string: str
    table: str
    publications: str  # directory
    rates: dict[str, float] = field(default_factory=dict)
    hard_share: float = 0.0  # share of crashes that exit the process (process workers)


def strategy_of(key: str) -> str:
    return "outbox" if key.startswith("outbox-") else "state"


class _Ambiguity(logging.Handler):
    """Counts this worker thread's resolutions of writes that had no answer."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.thread = threading.get_ident()
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        outcome = getattr(record, "outcome", None)
        if outcome is not None and record.thread == self.thread:
            self.counts[outcome] += 1


class _Worker:
    def __init__(self, config: WorkerConfig, outbox: Connection) -> None:
        self.config = config
        self.outbox = outbox
        self.injector = Injector(
            f"{config.seed}/{config.worker}/{config.incarnation}", config.rates
        )
        self.hard = random.Random(f"hard/{config.seed}/{config.worker}/{config.incarnation}")
        self.client = TableClient.from_connection_string(
            config.connection_string,
            config.table,
            transport=ChaosTransport(self.injector),
            retry_total=4,
            retry_backoff_factor=0.05,
        )
        self.ambiguity = _Ambiguity()
        engine_log = logging.getLogger("streamstone_py")
        engine_log.setLevel(logging.INFO)
        engine_log.addHandler(self.ambiguity)
        hooks.in_handler = self._in_handler
        self.path = os.path.join(config.publications, f"w{config.worker}-{config.incarnation}")
        self.generation = 0
        self._fresh()

    def _in_handler(self) -> None:
        self.injector.crash(CRASH_IN_HANDLER, "handler")

    def _fresh(self) -> None:
        """New processors, as a restarted worker has (publications go to a new file)."""
        self.generation += 1
        publisher = FilePublisher(f"{self.path}-{self.generation}.jsonl", self.injector)
        self.processors = {
            strategy: Processor(
                ledger,
                self.client,
                publisher,
                strategy=strategy,  # type: ignore[arg-type]
                retry=RETRY,
                max_attempts=50,
                store=ChaosStore(self.client, HANDLER, RETRY, self.injector),
            )
            for strategy in ("state", "outbox")
        }
        self.conflicts_base = 0

    def figures(self) -> dict[str, Any]:
        """What happened since the last report (faults, conflicts, ambiguous writes)."""
        conflicts = sum(p.stats.conflicts_retried for p in self.processors.values())
        delta = {
            "faults": dict(self.injector.counts),
            "conflicts": conflicts - self.conflicts_base,
            "ambiguous": dict(self.ambiguity.counts),
        }
        self.injector.counts.clear()
        self.ambiguity.counts.clear()
        self.conflicts_base = conflicts
        return delta

    def send(self, *message: Any) -> None:
        self.outbox.send((message[0], self.config.worker, *message[1:], self.figures()))

    def run_chunk(self, chunk: int, mode: str, deliveries: Sequence[tuple[int, bytes]]) -> None:
        groups: dict[str, list[tuple[int, Message]]] = {}
        for delivery, data in deliveries:
            message = Message.decode(data)
            groups.setdefault(message.key, []).append((delivery, message))
        for key, items in groups.items():
            processor = self.processors[strategy_of(key)]
            try:
                if mode == "batch":
                    outcomes = processor.process_batch(key, [m for _, m in items])
                    self.send("ack", chunk, _acks(items, outcomes))
                else:
                    for delivery, message in items:
                        outcome = processor.process(message)
                        self.send("ack", chunk, _acks([(delivery, message)], [outcome]))
            except Crash as crash:
                hard = self.config.hard_share > 0 and self.hard.random() < self.config.hard_share
                self.send("crash", chunk, crash.kind, hard)
                if hard:
                    os._exit(70)  # a killed process: no clean-up, no flushing
                self._fresh()
                return
            except Exception:  # a bug, not a fault: the oracle run fails on it
                self.send("error", chunk, traceback.format_exc())
                self._fresh()
                return
        self.send("done", chunk)


def _acks(
    items: Sequence[tuple[int, Message]], outcomes: Sequence[Outcome]
) -> list[tuple[int, str, int | None, str | None]]:
    return [
        (delivery, o.status, o.version, o.reason)
        for (delivery, _), o in zip(items, outcomes, strict=True)
    ]


def work(config: WorkerConfig, inbox: Connection, outbox: Connection) -> None:
    """The worker loop: until the coordinator sends ``None``."""
    worker = _Worker(config, outbox)
    try:
        while (task := inbox.recv()) is not None:
            worker.run_chunk(*task)
    finally:
        logging.getLogger("streamstone_py").removeHandler(worker.ambiguity)
        hooks.in_handler = None
        worker.client.close()
