"""A worker: takes chunks of deliveries from the coordinator, processes them, acknowledges.

The same loop runs in a thread or in a separate process; it talks to the
coordinator over two one-way pipes. Besides chunks of deliveries it runs
retention (``Processor.retain``) when asked, through the same faulty store.
A crash (see :mod:`.injector`) ends the chunk: the worker reports it, drops
its processors as a restarted worker would, and the coordinator redelivers
what was not acknowledged. In a process
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
from datetime import datetime
from multiprocessing.connection import Connection
from typing import Any

from azure.core.exceptions import AzureError
from azure.data.tables import TableClient
from opentelemetry.sdk.trace import TracerProvider

from handlers import HeaderCache, Message, NonDeterministicHandlerError, Outcome, Processor
from handlers._messages._codec import unpack
from handlers._outcome import StrategyName
from streamstone_py import Partition, RetryPolicy, Stream, StreamstoneError, join_binary

from .injector import (
    CRASH_IN_HANDLER,
    ChaosStore,
    ChaosTransport,
    ChaosWireTableClient,
    Crash,
    FilePublisher,
    Injector,
)
from .ledger import HANDLER, VERSIONS, hooks
from .tracing import install

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
    transport: str = "wire"  # the engine's runner: "wire" or "sdk"
    tracing: bool = False  # a process worker's own SDK (threads share the coordinator's)


def strategy_of(key: str) -> StrategyName:
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
        self.client = self._client()
        # Instrumentation only (not under test): reads no fault may disturb.
        self.plain = TableClient.from_connection_string(config.connection_string, config.table)
        self.case2 = 0
        self.ambiguity = _Ambiguity()
        engine_log = logging.getLogger("streamstone_py")
        engine_log.setLevel(logging.INFO)
        engine_log.addHandler(self.ambiguity)
        hooks.in_handler = self._in_handler
        self.path = os.path.join(config.publications, f"w{config.worker}-{config.incarnation}")
        self.generation = 0
        self.draw = random.Random(f"shape/{config.seed}/{config.worker}/{config.incarnation}")
        self._fresh()

    def _client(self) -> TableClient:
        if self.config.transport == "wire":
            return ChaosWireTableClient.from_connection_string(
                self.config.connection_string, self.config.table, injector=self.injector
            )
        return TableClient.from_connection_string(
            self.config.connection_string,
            self.config.table,
            transport=ChaosTransport(self.injector),
            retry_total=4,
            retry_backoff_factor=0.05,
        )

    def _in_handler(self) -> None:
        self.injector.crash(CRASH_IN_HANDLER, "handler")

    def _fresh(self) -> None:
        """New processors, as a restarted worker has (publications go to a new file)."""
        self.generation += 1
        self.publisher = FilePublisher(f"{self.path}-{self.generation}.jsonl", self.injector)
        # Odd generations keep a header cache (as Spark workers do), even ones
        # read every header: a restart starts with an empty cache, or none.
        self.cache = HeaderCache() if self.generation % 2 else None
        # How a key's messages are cut into process_batch chunks: small cuts
        # split most long chunks and many batches, so a refused or faulted
        # message meets the key's next chunk.
        self.max_batch = self.draw.choice([2, 3, 7, 500])
        # Half the generations open a client per chunk and close it after, with
        # one cache shared by every processor and chunk (a cached header must
        # never bring back a closed client, nor another processor's).
        self.client_per_chunk = self.draw.random() < 0.5
        self.conflicts_base = self.conflicts_retired = 0
        self.splits_base = self.splits_retired = 0
        self._processors(self.client)

    def _processors(self, client: TableClient) -> None:
        self.store = ChaosStore(client, HANDLER, RETRY, self.injector)
        self.processors = {
            (strategy, version): self._processor(strategy, version)
            for strategy in ("state", "outbox")
            for version in VERSIONS
        }

    def _retire(self) -> None:
        """Keep the figures of processors about to be dropped."""
        self.conflicts_retired += sum(p.stats.conflicts_retried for p in self.processors.values())
        self.splits_retired += self.store.splits

    def _processor(self, strategy: StrategyName, version: int, **options: Any) -> Processor[Any]:
        return Processor(
            VERSIONS[version],
            self.client,
            self.publisher,
            strategy=strategy,
            retry=RETRY,
            max_attempts=50,
            store=self.store,
            cache=self.cache,
            max_batch=self.max_batch,
            **options,
        )

    def figures(self) -> dict[str, Any]:
        """What happened since the last report (faults, conflicts, ambiguous writes)."""
        current = sum(p.stats.conflicts_retried for p in self.processors.values())
        conflicts = self.conflicts_retired + current
        splits = self.splits_retired + self.store.splits
        delta = {
            "faults": dict(self.injector.counts),
            "conflicts": conflicts - self.conflicts_base,
            "ambiguous": dict(self.ambiguity.counts),
            "splits": splits - self.splits_base,
            "case2": self.case2,
        }
        self.injector.counts.clear()
        self.ambiguity.counts.clear()
        self.conflicts_base = conflicts
        self.splits_base = splits
        self.case2 = 0
        return delta

    def send(self, *message: Any) -> None:
        self.outbox.send((message[0], self.config.worker, *message[1:], self.figures()))

    def run_task(self, chunk: int, mode: str, payload: Any, version: int) -> None:
        if mode == "retain":
            self.retain(chunk, version, *payload)
        elif self.client_per_chunk:
            # A unit of work with its own client, closed by its with block; the
            # cache outlives it, and the worker's own client serves retention.
            with self._client() as client:
                self._retire()
                self._processors(client)
                try:
                    self.run_chunk(chunk, mode, payload, version)
                finally:
                    self._retire()
                    self._processors(self.client)
        else:
            self.run_chunk(chunk, mode, payload, version)

    def retain(
        self, chunk: int, version: int, key: str, keep_last: int | None, limit: str, now: str
    ) -> None:
        """Retention of one key: versions processed before ``limit`` may go.

        The coordinator's ``now`` is the retain's clock, so the limit is
        exactly the one it chose, however late this worker gets to it.
        """
        at = datetime.fromisoformat(now)
        processor = self._processor(strategy_of(key), version, clock=lambda: at)
        older_than = at - datetime.fromisoformat(limit)
        self.injector.retaining = True
        try:
            removed = processor.retain(key, keep_last=keep_last, older_than=older_than)
        except Crash as crash:
            self._crashed(chunk, crash)
            return
        except (AzureError, StreamstoneError) as exc:  # storage gave up: interrupted too
            self.send("retained", chunk, key, None, f"{type(exc).__name__}: {exc}")
            return
        except Exception:
            self.send("error", chunk, traceback.format_exc())
            self._fresh()
            return
        finally:
            self.injector.retaining = False
        self.send("retained", chunk, key, removed, None)

    def _crashed(self, chunk: int, crash: Crash) -> None:
        hard = self.config.hard_share > 0 and self.hard.random() < self.config.hard_share
        self.send("crash", chunk, crash.kind, hard)
        if hard:
            os._exit(70)  # a killed process: no clean-up, no flushing
        self._fresh()

    def _probe(self, outcomes: Sequence[Outcome]) -> None:
        """Count the duplicates that would fail on the newest state (issue 11, case 2)."""
        for outcome in outcomes:
            message = outcome.message
            if outcome.status != "duplicate" or message.type != "StrictWithdraw":
                continue
            try:
                stream = Stream.try_open(Partition(self.plain, message.key, HANDLER))
            except (AzureError, StreamstoneError):  # Azurite restarting: skip the figure
                continue
            if stream is not None and "State_Parts" in stream.properties:
                balance = unpack(join_binary("State", stream.properties))["balance"]
                self.case2 += int(message.body["amount"]) > balance

    def run_chunk(
        self, chunk: int, mode: str, deliveries: Sequence[tuple[int, bytes]], version: int
    ) -> None:
        groups: dict[str, list[tuple[int, Message]]] = {}
        for delivery, data in deliveries:
            message = Message.decode(data)
            groups.setdefault(message.key, []).append((delivery, message))
        for key, items in groups.items():
            processor = self.processors[strategy_of(key), version]
            try:
                if mode == "long":
                    # A crash inside the handler, drawn per message, would end
                    # nearly every long chunk before its write could split.
                    hooks.in_handler = None
                    try:
                        outcomes = processor.process_batch(key, [m for _, m in items])
                    finally:
                        hooks.in_handler = self._in_handler
                    self._probe(outcomes)
                    self.send("ack", chunk, _acks(items, outcomes))
                elif mode == "batch":
                    outcomes = processor.process_batch(key, [m for _, m in items])
                    self._probe(outcomes)
                    self.send("ack", chunk, _acks(items, outcomes))
                else:
                    for delivery, message in items:
                        outcome = _process(processor, message)
                        self._probe([outcome])
                        self.send("ack", chunk, _acks([(delivery, message)], [outcome]))
            except Crash as crash:
                self._crashed(chunk, crash)
                return
            except Exception:  # a bug, not a fault: the oracle run fails on it
                self.send("error", chunk, traceback.format_exc())
                self._fresh()
                return
        self.send("done", chunk)


def _process(processor: Processor[Any], message: Message) -> Outcome:
    """``process``, with its raised non-determinism as the outcome ``process_batch`` gives."""
    try:
        return processor.process(message)
    except NonDeterministicHandlerError as exc:
        return Outcome(message, "abandoned", None, (), str(exc), exc)


def _acks(
    items: Sequence[tuple[int, Message]], outcomes: Sequence[Outcome]
) -> list[tuple[int, str, int | None, str | None, str | None]]:
    return [
        (delivery, o.status, o.version, o.reason, type(o.error).__name__ if o.error else None)
        for (delivery, _), o in zip(items, outcomes, strict=True)
    ]


def work(config: WorkerConfig, inbox: Connection, outbox: Connection) -> None:
    """The worker loop: until the coordinator sends ``None``."""
    if config.tracing:
        install(TracerProvider())
    worker = _Worker(config, outbox)
    try:
        while (task := inbox.recv()) is not None:
            worker.run_task(*task)
    finally:
        logging.getLogger("streamstone_py").removeHandler(worker.ambiguity)
        hooks.in_handler = None
        worker.client.close()
        worker.plain.close()
