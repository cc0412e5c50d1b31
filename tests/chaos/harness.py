"""The coordinator: a broker over one shuffled log, workers, Azurite restarts, then the oracle.

The log holds every message 1 to ``max_copies`` times, shuffled; some copies
are held back and arrive several segments later (late redeliveries). Idle
workers get chunks of the log; a chunk is processed with ``process_batch``
per key or with ``process`` per message. What a worker does not acknowledge
(it crashed, or storage gave up and the outcome is "faulted") is delivered
again, soon or late, as a broker redelivers after a lock expires. When the log
is exhausted and every delivery settled, the oracle reads storage and the
publications and reports violations.

The workload also reaches where a short chunk over many keys never goes:

- long chunks: up to ``long_max`` messages of one key in one
  ``process_batch``, new ones mixed with redeliveries, so writes split over
  several transactions and a later one meets a stored duplicate or a crash;
- retention: workers run ``Processor.retain`` beside the processing, through
  the same faulty store, so some retains are interrupted; the run ends with
  a fault-free retain of every key, which must finish what was interrupted;
- a handler that raises on some states (``StrictWithdraw``): a message
  abandoned by its own failure is redelivered at most ``max_failures`` times,
  then given up (legitimate only if it was never stored);
- state evolution: from ``evolve_at`` of the run on, workers process with
  ``ledger_v2``, whose state class dropped a field and gained one;
- chunked keys: each worker generation draws the ``max_batch`` of its
  processors (2, 3, 7 or 500), so a key's chunk is cut into several
  ``process_batch`` chunks and a refused or faulted message meets the next;
- one header cache shared by every processor of a worker, and in half the
  generations a client per chunk, closed after it, the cache kept.

Retention must not refuse a message that was never stored, and the oracle
must know every version a retain removes. So the coordinator reads the key's
versions, then picks the retain's time limit below the ``sent_at`` of every
message still to be delivered and not in that read (under the state
strategy: not acknowledged either): a version committed after the read
belongs to such a message, so it is younger than the limit and stays.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import random
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from azure.core.exceptions import AzureError
from azure.data.tables import TableClient, TableServiceClient

from azurite.launcher import AzuriteTable
from handlers import InMemoryPublisher, Message, Processor
from streamstone_py import Partition, RetryPolicy, Stream, StreamstoneError, join_binary

from .injector import DEFAULT_RATES, KINDS
from .ledger import HANDLER, TYPES, ledger_v2, shared
from .oracle import HANDLER_FAILED, Fates, StoredKey, check
from .tracing import delivered, traced
from .worker import WorkerConfig, work

TABLE = "chaos"


def _transport_of(choice: str, worker: int) -> str:
    """A worker's runner: the run's choice, or by worker (even: wire) when "mixed"."""
    if choice == "mixed":
        return "wire" if worker % 2 == 0 else "sdk"
    return choice


#: Patient enough for an Azurite restart: the coordinator's own reads must not fail.
PLAIN_RETRY = RetryPolicy(attempts=30, initial_delay=0.1, max_delay=1.0, total_time=90.0)

#: Below the oldest unacknowledged ``sent_at``, so that clock granularity cannot matter.
RETAIN_MARGIN = timedelta(seconds=1)

#: The outcome errors of a message abandoned for what came before it, not for itself.
COLLATERAL = "HandlerError"
REFUSED = "DuplicateOutsideWindowError"


@dataclass(frozen=True)
class ChaosConfig:
    """One run. ``duration`` (seconds of new messages) wins over ``messages``."""

    seed: int = 1
    duration: float | None = None
    messages: int = 2_000
    threads: int = 2
    processes: int = 2
    keys: int = 12  # per strategy
    max_copies: int = 5
    late_share: float = 0.15
    chunk: int = 24
    batch_share: float = 0.6
    restarts: int = 1
    hard_share: float = 0.05
    rates: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_RATES))
    stall: float = 120.0
    #: Most seconds of settling once no new messages come: whatever happens, a
    #: run ends (a message that fails for ever is given up sooner, by max_failures).
    settle: float = 3600.0
    long_share: float = 0.06  # of chunks: many messages of one key
    long_max: int = 150
    retain_share: float = 0.05  # of dispatches: a retain instead of a chunk
    max_failures: int = 6  # own failures of one message before it is given up
    evolve_at: float | None = 0.5  # share of the run after which ledger_v2 processes
    #: The workers' runner: "wire" (the default), "sdk", or "mixed" (by worker).
    transport: str = "wire"
    #: The OpenTelemetry SDK behind every worker, each delivery in a trace of its own.
    tracing: bool = False

    def __post_init__(self) -> None:
        if self.threads < 0 or self.processes < 0 or self.threads + self.processes < 1:
            raise ValueError(f"need at least one worker, got {self.threads=} {self.processes=}")
        if self.transport not in ("wire", "sdk", "mixed"):
            raise ValueError(f"transport must be wire, sdk or mixed, got {self.transport!r}")
        if self.duration is not None and self.duration <= 0:
            raise ValueError(f"duration must be > 0 seconds, got {self.duration!r}")
        if self.messages < 1 or self.keys < 1 or self.max_copies < 1:
            raise ValueError(f"messages, keys and max_copies must be >= 1: {self!r}")


@dataclass
class Report:
    """The figures of a run; ``violations`` must be empty."""

    config: ChaosConfig
    messages: int = 0
    log_copies: int = 0
    deliveries: int = 0
    redeliveries: int = 0
    late: int = 0
    chunks: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    process_kills: int = 0
    restarts: int = 0
    conflicts: int = 0
    ambiguous: Counter[str] = field(default_factory=Counter)
    outputs_published: int = 0
    outputs_traced: int = 0  # published with a traceparent header
    long_chunks: int = 0
    splits: int = 0
    retains: int = 0
    retains_interrupted: int = 0
    retained_versions: int = 0
    final_retained: int = 0
    evolutions: int = 0
    v2_chunks: int = 0
    states_by_version: Counter[int] = field(default_factory=Counter)
    handler_failures: int = 0
    given_up: int = 0
    refused: int = 0
    case2: int = 0
    errors: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    elapsed: float = 0.0

    def absorb(self, figures: dict[str, Any]) -> None:
        self.faults.update(figures["faults"])
        self.conflicts += figures["conflicts"]
        self.ambiguous.update(figures["ambiguous"])
        self.splits += figures["splits"]
        self.case2 += figures["case2"]

    def table(self) -> str:
        c = self.config
        rows = [
            ("seed", f"{c.seed}"),
            ("workers", f"{c.threads} threads + {c.processes} processes, {c.transport} runner"),
            ("elapsed", f"{self.elapsed:.1f} s"),
            ("messages (distinct)", f"{self.messages:,} over {2 * c.keys} keys"),
            ("copies in the log", f"{self.log_copies:,} (1 to {c.max_copies} per message)"),
            ("  of which held back (late)", f"{self.late:,}"),
            (
                "deliveries to workers",
                f"{self.deliveries:,} ({self.deliveries / max(self.elapsed, 1e-9):,.0f}/s)",
            ),
            ("  redeliveries after a fault", f"{self.redeliveries:,}"),
            (
                "chunks (process_batch / process)",
                f"{self.chunks['batch']:,} / {self.chunks['single']:,}",
            ),
            *((f"outcome {k}", f"{v:,}") for k, v in sorted(self.outcomes.items())),
            *((f"fault: {k}", f"{self.faults[k]:,}") for k in KINDS),
            ("  worker processes killed", f"{self.process_kills:,}"),
            ("Azurite restarts", f"{self.restarts}"),
            ("conflicts retried", f"{self.conflicts:,}"),
            *(
                (f"ambiguous writes resolved: {k}", f"{v:,}")
                for k, v in sorted(self.ambiguous.items())
            ),
            ("outputs published (repeats included)", f"{self.outputs_published:,}"),
            ("outputs carrying a traceparent", f"{self.outputs_traced:,}"),
            ("long chunks (one key)", f"{self.long_chunks:,} (up to {c.long_max} messages)"),
            ("split writes (> 99 rows)", f"{self.splits:,}"),
            ("retains", f"{self.retains:,} ({self.retained_versions:,} versions removed)"),
            ("  interrupted (crash or storage gave up)", f"{self.retains_interrupted:,}"),
            ("  final fault-free retains removed", f"{self.final_retained:,} versions"),
            ("evolutions (ledger -> ledger_v2)", f"{self.evolutions} ({self.v2_chunks:,} chunks)"),
            (
                "stored states v1 / v2",
                f"{self.states_by_version[1]:,} / {self.states_by_version[2]:,}",
            ),
            ("conditional handler failures", f"{self.handler_failures:,}"),
            ("  given up (raised every time)", f"{self.given_up:,}"),
            ("duplicates that fail on the newest state", f"{self.case2:,}"),
            ("refused outside the retention window", f"{self.refused:,}"),
            ("worker errors", f"{len(self.errors)}"),
            ("violations", f"{len(self.violations)}"),
        ]
        width = max(len(k) for k, _ in rows)
        lines = [f"{k:<{width}}  {v}" for k, v in rows]
        lines += [f"  ! {v}" for v in self.violations[:20]]
        lines += [f"  ! worker error: {e.strip().splitlines()[-1]}" for e in self.errors[:5]]
        return "\n".join(lines)


class _Log:
    """The shuffled log with its copies, late copies and redeliveries."""

    def __init__(self, config: ChaosConfig) -> None:
        self.config = config
        self.random = random.Random(f"log/{config.seed}")
        self.keys = [f"{s}-{i:03d}" for s in ("state", "outbox") for i in range(config.keys)]
        self.messages: dict[str, Message] = {}
        self.pending: list[Message] = []
        self.held: list[tuple[int, Message]] = []  # (segment to release at, message)
        self.segment = 0

    def extend(self, count: int, report: Report) -> None:
        """Append ``count`` new messages (all their copies) and release due late copies."""
        self.segment += 1
        copies: list[Message] = []
        for _ in range(count):
            message = self._new()
            n = self.random.randint(1, self.config.max_copies)
            report.log_copies += n
            for i in range(n):
                if i > 0 and self.random.random() < self.config.late_share:
                    self.held.append((self.segment + self.random.randint(1, 4), message))
                    report.late += 1
                else:
                    copies.append(message)
        self.random.shuffle(copies)
        due = [m for at, m in self.held if at <= self.segment]
        self.held = [(at, m) for at, m in self.held if at > self.segment]
        self.pending += copies
        for message in due:
            self.pending.insert(self.random.randrange(len(self.pending) + 1), message)

    def _new(self, key: str | None = None, strict: bool = True) -> Message:
        n = len(self.messages)
        # Withdrawals outweigh deposits, so balances stay low and strict
        # withdrawals often fail, on some states and not on others.
        kind = self.random.choices(TYPES, weights=(38, 30, 17 if strict else 0, 15))[0]
        message = Message(
            f"m{self.config.seed}-{n:07d}",
            key or self.random.choice(self.keys),
            kind,
            {"amount": self.random.randint(1, 100)},
            {"sent_at": datetime.now(UTC).isoformat()},
        )
        self.messages[message.id] = message
        return message

    def burst(self, key: str, count: int, report: Report) -> list[Message]:
        """``count`` new messages of ``key``: one copy each now, the others into the log."""
        now = []
        for _ in range(count):
            # No strict withdrawal: one that fails stops the rest of the batch,
            # and these messages are here to make the write split.
            message = self._new(key, strict=False)
            now.append(message)
            n = self.random.randint(1, self.config.max_copies)
            report.log_copies += n
            for _ in range(n - 1):
                if self.random.random() < self.config.late_share:
                    self.held.append((self.segment + self.random.randint(1, 4), message))
                    report.late += 1
                else:
                    self.pending.insert(self.random.randrange(len(self.pending) + 1), message)
        return now

    def take_key(self, key: str, n: int) -> list[Message]:
        """Up to ``n`` pending deliveries of ``key``, in log order."""
        chunk = [m for m in self.pending if m.key == key][:n]
        taken = {id(m) for m in chunk}
        self.pending = [m for m in self.pending if id(m) not in taken]
        return chunk

    def drop(self, message_id: str) -> None:
        """Dead-letter every copy still in the log."""
        self.pending = [m for m in self.pending if m.id != message_id]
        self.held = [(at, m) for at, m in self.held if m.id != message_id]

    def redeliver(self, messages: list[Message]) -> None:
        for message in messages:
            if self.random.random() < self.config.late_share:
                self.held.append((self.segment + self.random.randint(1, 3), message))
            else:  # soon: among the next few deliveries
                self.pending.insert(self.random.randrange(min(len(self.pending), 30) + 1), message)

    def take(self, n: int) -> list[Message]:
        if not self.pending and self.held:
            self.pending = [m for _, m in self.held]  # the log is exhausted: the rest arrive now
            self.held = []
            self.random.shuffle(self.pending)
        chunk, self.pending = self.pending[:n], self.pending[n:]
        return chunk


@dataclass
class _Handle:
    worker: int
    process: bool
    incarnation: int = 0
    send: Connection | None = None
    recv: Connection | None = None
    runner: Any = None  # a Thread or a Process
    inflight: dict[int, Message] = field(default_factory=dict)
    busy: bool = False
    retaining: str | None = None  # the key of the retain it runs


class _Coordinator:
    def __init__(self, config: ChaosConfig, azurite: AzuriteTable, publications: str) -> None:
        self.config = config
        self.azurite = azurite
        self.publications = publications
        self.report = Report(config)
        self.log = _Log(config)
        self.random = random.Random(f"broker/{config.seed}")
        self.reported: dict[str, set[int | None]] = defaultdict(set)
        self.settled: set[str] = set()
        self.delivery = 0
        self.chunk = 0
        self.spawn = multiprocessing.get_context("spawn")
        self.traces = random.Random(f"traces/{config.seed}")
        workers = range(config.threads + config.processes)
        self.handles = [_Handle(w, process=w >= config.threads) for w in workers]
        self.restarter: threading.Thread | None = None
        self.restarts_due = 0
        self.fates = Fates()
        self.failures: Counter[str] = Counter()
        self.seen: dict[str, dict[int, tuple[str, bytes]]] = defaultdict(dict)
        self.version = 1
        self.started = 0.0
        self.plain = TableClient.from_connection_string(azurite.connection_string, TABLE)

    # --- workers -------------------------------------------------------------

    def _start(self, handle: _Handle) -> None:
        handle.incarnation += 1
        worker_config = WorkerConfig(
            worker=handle.worker,
            incarnation=handle.incarnation,
            seed=self.config.seed,
            connection_string=self.azurite.connection_string,
            table=TABLE,
            publications=self.publications,
            rates=self.config.rates,
            hard_share=self.config.hard_share if handle.process else 0.0,
            transport=_transport_of(self.config.transport, handle.worker),
            tracing=self.config.tracing and handle.process,
        )
        inbox, handle.send = multiprocessing.Pipe(duplex=False)
        handle.recv, outbox = multiprocessing.Pipe(duplex=False)
        args = (worker_config, inbox, outbox)
        if handle.process:
            handle.runner = self.spawn.Process(target=work, args=args, daemon=True)
        else:
            handle.runner = threading.Thread(target=work, args=args, daemon=True)
        handle.runner.start()
        handle.busy = False

    def _dispatch(self, handle: _Handle) -> None:
        draw = self.random.random()
        busy = self._generating(self.started) or self.log.pending or self.log.held
        if busy and draw < self.config.retain_share and self._retain(handle):
            return
        mode = "batch" if self.random.random() < self.config.batch_share else "single"
        if draw > 1 - self.config.long_share:
            messages = self._long()
            mode = "long"
        else:
            messages = self.log.take(self.random.randint(1, self.config.chunk))
        if not messages:
            return
        self.chunk += 1
        self.report.chunks["single" if mode == "single" else "batch"] += 1
        self.report.v2_chunks += self.version == 2
        task = []
        for message in messages:
            self.delivery += 1
            handle.inflight[self.delivery] = message
            if self.config.tracing:
                message = delivered(message, self.traces)
            task.append((self.delivery, message.encode()))
        self.report.deliveries += len(task)
        assert handle.send is not None
        handle.send.send((self.chunk, mode, task, self.version))
        handle.busy = True

    def _long(self) -> list[Message]:
        """Many messages of one key: its redeliveries in the log, topped up with new ones."""
        key = self.random.choice(self.log.keys)
        n = self.random.randint(self.config.long_max // 3, self.config.long_max)
        messages = self.log.take_key(key, n // 3)
        fresh: list[Message] = []
        if self._generating(self.started):
            count = n - len(messages)
            if self.config.duration is None:
                count = min(count, self.config.messages - len(self.log.messages))
            fresh = self.log.burst(key, max(count, 0), self.report)
        # New messages first, enough to fill a first transaction, then the rest
        # mixed with redeliveries: a later transaction meets stored duplicates.
        head, tail = fresh[:50], fresh[50:] + messages
        self.random.shuffle(tail)
        self.report.long_chunks += 1
        return head + tail

    def _retain(self, handle: _Handle) -> bool:
        """Ask ``handle`` to retain a key; False if its versions could not be read first."""
        key = self.random.choice(self.log.keys)
        if self.random.random() < 0.5:  # the key retention can cut furthest now
            key = max(self.log.keys, key=lambda k: self._limit(k, set()))
        try:
            self._snapshot(key)
        except (AzureError, StreamstoneError):
            return False
        # Under outbox, retention must keep what is stored and not dispatched
        # (issue 11, case 5), so only messages not stored hold the limit back;
        # under state it cannot know what was published, so every message
        # not acknowledged does.
        stored = {i for i, _ in self.seen[key].values()} if key.startswith("outbox-") else set()
        now = datetime.now(UTC)
        limit = self._limit(key, stored)
        self.chunk += 1
        self.report.retains += 1
        keep_last = self.random.choice((None, 0, 1, 2, 5))
        assert handle.send is not None
        payload = (key, keep_last, limit.isoformat(), now.isoformat())
        handle.send.send((self.chunk, "retain", payload, self.version))
        handle.busy = True
        handle.retaining = key
        return True

    def _limit(self, key: str, stored: set[str]) -> datetime:
        """Below the ``sent_at`` of every message of ``key`` still to come, but ``stored``."""
        waiting = [*self.log.pending, *(m for _, m in self.log.held)]
        waiting += [m for h in self.handles for m in h.inflight.values()]
        sent = [
            datetime.fromisoformat(m.headers["sent_at"])
            for m in waiting
            if m.key == key and m.id not in self.settled and m.id not in stored
        ]
        return min([datetime.now(UTC), *sent]) - RETAIN_MARGIN

    def _snapshot(self, key: str) -> None:
        """Read every version of ``key`` now: a retain may remove them."""
        partition = Partition(self.plain, key, HANDLER, retry=PLAIN_RETRY)
        stream = Stream.try_open(partition)
        if stream is None:
            return
        version = max(1, stream.first_version)
        known = self.seen[key]
        while version <= stream.version:
            page = Stream.read(partition, start_version=version, slice_size=1000)
            for event in page.events:
                known[event.version] = (event.id or "", join_binary("State", event.properties))
            if page.is_end_of_stream or not page.events:
                break
            version = page.events[-1].version + 1

    def _lose(self, handle: _Handle) -> None:
        """Redeliver what the worker held and did not acknowledge."""
        lost = list(handle.inflight.values())
        handle.inflight.clear()
        self.report.redeliveries += len(lost)
        self.log.redeliver(lost)
        handle.busy = False
        if handle.retaining is not None:
            self.report.retains_interrupted += 1
            handle.retaining = None

    def _settle(
        self,
        message: Message,
        status: str,
        version: int | None,
        error: str | None,
        reason: str | None,
    ) -> None:
        """One acknowledged delivery: settled, refused, redelivered, or given up."""
        self.report.outcomes[status] += 1
        if status in ("completed", "duplicate"):
            self.reported[message.id].add(version)
            self.settled.add(message.id)
            self.fates.given_up.pop(message.id, None)  # answered after all
            return
        if status == "abandoned" and error == REFUSED:
            self.fates.refused[message.id] = reason or ""
            self.report.refused += 1
            return
        if status == "abandoned" and error != COLLATERAL:
            self.report.handler_failures += error == HANDLER_FAILED
            self.failures[message.id] += 1
            if message.id in self.fates.given_up:
                return  # a copy that was on its way when it was given up
            if self.failures[message.id] >= self.config.max_failures:
                self.fates.given_up[message.id] = (error or "", reason or "")
                self.log.drop(message.id)
                return
        # faulted (storage gave up), abandoned behind a failed message, or failed
        # fewer than max_failures times: the broker tries again
        self.report.redeliveries += 1
        self.log.redeliver([message])

    def _receive(self, handle: _Handle, note: tuple[Any, ...]) -> None:
        kind, _, _, *rest, figures = note
        self.report.absorb(figures)
        if kind == "ack":
            (acks,) = rest
            for delivery, status, version, reason, error in acks:
                self._settle(handle.inflight.pop(delivery), status, version, error, reason)
        elif kind == "retained":
            _key, removed, failure = rest
            if failure is not None:
                self.report.retains_interrupted += 1
            else:
                self.report.retained_versions += removed
            handle.retaining = None
            handle.busy = False
        elif kind == "crash":
            _fault, hard = rest
            self.report.process_kills += bool(hard)
            self._lose(handle)
            handle.busy = bool(hard)  # a killed process takes no work until it is replaced
        elif kind == "error":
            (trace,) = rest
            self.report.errors.append(trace)
            self._lose(handle)
        else:  # done: every delivery of the chunk was acknowledged
            if handle.inflight:
                self.report.errors.append(f"worker {handle.worker} left deliveries unanswered")
                self._lose(handle)
            handle.busy = False

    def _drain(self, handle: _Handle) -> bool:
        """Take in every report waiting; False once the worker's end is closed."""
        assert handle.recv is not None
        try:
            while handle.recv.poll():
                self._receive(handle, handle.recv.recv())
        except EOFError:
            return False
        return True

    def _died(self, handle: _Handle) -> None:
        """The worker ended (a killed process): redeliver its work, start a new one."""
        self._drain(handle)
        handle.runner.join()
        if handle.inflight:
            self.report.errors.append(f"worker {handle.worker} ended without a crash report")
            self._lose(handle)
        assert handle.send is not None
        assert handle.recv is not None
        handle.send.close()
        handle.recv.close()
        self._start(handle)

    # --- Azurite restarts -----------------------------------------------------

    def _progress(self, started: float) -> float:
        if self.config.duration is not None:
            return (time.monotonic() - started) / self.config.duration
        return len(self.settled) / self.config.messages

    def _maybe_restart(self, started: float) -> None:
        if self.restarter is not None and not self.restarter.is_alive():
            self.restarter.join()
            self.restarter = None
            self.report.restarts += 1
        due = int(self._progress(started) * (self.config.restarts + 1))
        if self.restarter is None and self.restarts_due < min(due, self.config.restarts):
            self.restarts_due += 1
            self.restarter = threading.Thread(target=self.azurite.restart, daemon=True)
            self.restarter.start()

    # --- the run --------------------------------------------------------------

    def _maybe_evolve(self, started: float) -> None:
        at = self.config.evolve_at
        if at is not None and self.version == 1 and self._progress(started) >= at:
            self.version = 2
            self.report.evolutions += 1

    def _generating(self, started: float) -> bool:
        if self.config.duration is not None:
            return time.monotonic() - started < self.config.duration
        return len(self.log.messages) < self.config.messages

    def run(self) -> Report:
        started = self.started = time.monotonic()
        for handle in self.handles:
            self._start(handle)
        last_progress = time.monotonic()
        generated: float | None = None
        try:
            while True:
                self._maybe_restart(started)
                self._maybe_evolve(started)
                workers = len(self.handles)
                low = 3 * workers * self.config.chunk
                while self._generating(started) and len(self.log.pending) < low:
                    left = self.config.messages - len(self.log.messages)
                    batch = 200 if self.config.duration is not None else min(200, left)
                    self.log.extend(batch, self.report)
                for handle in self.handles:
                    if not handle.busy:
                        self._dispatch(handle)
                idle = not any(h.busy for h in self.handles)
                if idle and not self._generating(started) and not self.log.pending + self.log.held:
                    break
                if not self._generating(started):
                    generated = generated or time.monotonic()
                    if time.monotonic() - generated > self.config.settle:
                        unsettled = len(self.log.pending) + len(self.log.held)
                        raise RuntimeError(
                            f"{unsettled} deliveries still unsettled {self.config.settle:.0f} s "
                            "after the last new message: stopped"
                        )
                ready = wait(self._waitables(), timeout=0.5)
                if ready:
                    last_progress = time.monotonic()
                elif time.monotonic() - last_progress > self.config.stall:
                    raise RuntimeError(f"no worker reported for {self.config.stall} s: stalled")
                for handle in self.handles:
                    ended = handle.recv in ready and not self._drain(handle)
                    if ended or (handle.process and handle.runner.sentinel in ready):
                        self._died(handle)
        finally:
            self._stop_workers()
            if self.restarter is not None:
                self.restarter.join()
                self.report.restarts += 1
        self.report.messages = len(self.log.messages)
        self.report.elapsed = time.monotonic() - started
        return self.report

    def _waitables(self) -> list[Any]:
        found: list[Any] = [h.recv for h in self.handles]
        found += [h.runner.sentinel for h in self.handles if h.process]
        return found

    def finish_retention(self) -> None:
        """A fault-free retain of every key: it must finish what interrupted retains left."""
        processors = {
            strategy: Processor(ledger_v2, self.plain, InMemoryPublisher(), strategy=strategy)
            for strategy in ("state", "outbox")
        }
        for key in self.log.keys:
            self._snapshot(key)
            processor = processors["outbox" if key.startswith("outbox-") else "state"]
            self.report.final_retained += processor.retain(
                key, keep_last=self.random.choice((1, 2, 5)), older_than=timedelta(0)
            )

    def _stop_workers(self) -> None:
        for handle in self.handles:
            if handle.send is not None:
                with contextlib.suppress(OSError):  # a killed worker's pipe
                    handle.send.send(None)
        for handle in self.handles:
            handle.runner.join(timeout=30)


def read_back(
    table: TableClient, keys: list[str], seen: dict[str, dict[int, tuple[str, bytes]]]
) -> dict[str, StoredKey]:
    """Each key's stream, header state, outbox rows and rows retention left behind,
    read with a fault-free client; ``seen``: the versions read during the run."""
    stored = {}
    prefix = f"{HANDLER}|OB-"
    for key in keys:
        found = StoredKey(seen=dict(seen.get(key, {})))
        partition = Partition(table, key, HANDLER)
        stream = Stream.try_open(partition)
        if stream is not None:
            if "State_Parts" in stream.properties:
                found.header_state = join_binary("State", stream.properties)
            # From the first kept version: a slice of versions retention removed is
            # empty, and is not the end of the stream.
            version = stream.first_version
            while True:
                page = Stream.read(partition, start_version=version, slice_size=1000)
                for event in page.events:
                    state = join_binary("State", event.properties)
                    found.events.append((event.version, event.id or "", state))
                    found.digests[event.version] = str(event.properties.get("Digest"))
                if page.is_end_of_stream or not page.events:
                    break
                version = page.events[-1].version + 1
        rows = table.query_entities(
            "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi",
            parameters={"pk": key, "lo": prefix, "hi": prefix[:-1] + "."},
        )
        for row in rows:
            found.outbox[row["RowKey"][len(prefix) :]] = bool(row.get("Dispatched"))
        if stream is not None:
            found.header_version = stream.version
            found.leftovers = _leftovers(table, partition, stream, found)
        stored[key] = found
    return stored


def _leftovers(
    table: TableClient, partition: Partition, stream: Stream, found: StoredKey
) -> list[str]:
    """Event rows below the first version, and id rows of no kept event (the id
    rows of kept events go to ``found.id_rows``, with the version they point at)."""
    kept = {partition.id_row_key(m): m for _, m, _ in found.events}
    low = partition.event_row_key(0)
    first = partition.event_row_key(stream.first_version)
    ids = partition.row_key_prefix + "SS-UID-"
    rows = [
        row
        for lo, hi in ((low, first), (ids, ids[:-1] + "."))
        for row in table.query_entities(
            "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi",
            parameters={"pk": partition.partition_key, "lo": lo, "hi": hi},
            select=["RowKey", "Version"],
        )
    ]
    for row in rows:
        if row["RowKey"] in kept:
            found.id_rows[kept[row["RowKey"]]] = int(row["Version"])
    return sorted(r["RowKey"] for r in rows if r["RowKey"] not in kept)


def state_versions(stored: dict[str, StoredKey]) -> Counter[int]:
    """How many stored states each state class wrote (0: neither)."""
    counts: Counter[int] = Counter()
    for found in stored.values():
        states = {v: s for v, (_, s) in found.seen.items()}
        states.update({v: s for v, _, s in found.events})
        for state in states.values():
            counts[shared(state)[1] or 0] += 1
    return counts


def publications(directory: str) -> list[bytes]:
    found = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        found += [bytes.fromhex(json.loads(line)) for line in path.read_text().splitlines()]
    return found


@contextmanager
def _azurite() -> Iterator[AzuriteTable]:
    with (
        tempfile.TemporaryDirectory(prefix="chaos-azurite-") as location,
        AzuriteTable(location=location) as azurite,
    ):
        yield azurite


def run(config: ChaosConfig) -> Report:
    """One chaos run against its own Azurite (on disk, so it survives restarts)."""
    with (
        _azurite() as azurite,
        tempfile.TemporaryDirectory(prefix="chaos-out-") as out,
        traced(config.tracing),
    ):
        TableServiceClient.from_connection_string(azurite.connection_string).create_table(TABLE)
        coordinator = _Coordinator(config, azurite, out)
        report = coordinator.run()
        coordinator.finish_retention()
        coordinator.plain.close()
        published = publications(out)
        report.outputs_published = len(published)
        report.outputs_traced = sum("traceparent" in Message.decode(p).headers for p in published)
        report.given_up = len(coordinator.fates.given_up)
        with TableClient.from_connection_string(azurite.connection_string, TABLE) as table:
            stored = read_back(table, coordinator.log.keys, coordinator.seen)
        report.states_by_version = state_versions(stored)
        report.violations = check(
            coordinator.log.messages,
            stored,
            published,
            coordinator.reported,
            [k for k in coordinator.log.keys if k.startswith("outbox-")],
            coordinator.fates,
        )
        report.violations += [f"error: {e.strip().splitlines()[-1]}" for e in report.errors]
        return report
