"""The chaos harness's token mode: key-to-key messages under crashes, copies
and retention, then every credit delivered again at the end.

Senders take ``Transfer`` messages from outside (each one to three times) and
send a ``Credit`` to a receiver with a token; a simulated broker holds every
delivery, and workers take a key's deliveries in random batches. A worker
dies (a ``BaseException``) at random before or after any storage call, token
step or halfway through publishing; what it did not acknowledge comes again.
Receivers are cut to their newest version by ``retain(keep_last=1)`` all
along. When the time is up, the broker is drained without faults, every key
retained to its header, and every credit ever dispatched delivered again,
twice.

The oracle: each stored transfer debited its sender once and credited its
receiver once (so money is conserved), every credit copy at the end is a
duplicate or consumed, and no token or registration is left.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from azure.data.tables import TableClient, TableServiceClient

from handlers import InMemoryPublisher, Message, Processor, StateStore
from handlers._batch._token_rows import TokenRows
from handlers.examples import accounts
from streamstone_py import Partition, RetryPolicy, is_stream_row_key

__all__ = ["TokenChaosConfig", "TokenReport", "run_tokens"]

FAST = RetryPolicy(initial_delay=0.001, max_delay=0.01)


class Crash(BaseException):
    """The worker died here."""


@dataclass(frozen=True)
class TokenChaosConfig:
    seed: int = 1
    duration: float = 60.0
    threads: int = 2
    senders: int = 4
    receivers: int = 4
    #: The chance that a storage call or token step kills its worker.
    crash_rate: float = 0.03
    #: The chance that a batch is followed by a retention of its key.
    retain_rate: float = 0.2
    #: Seconds between two new transfers (each sent one to three times).
    interval: float = 0.05


@dataclass
class TokenReport:
    transfers: int = 0
    deliveries: int = 0
    crashes: int = 0
    retains: int = 0
    late_copies: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)

    def table(self) -> str:
        return "\n".join([
            f"transfers stored       {self.transfers}",
            f"deliveries             {self.deliveries}",
            f"crashes                {self.crashes}",
            f"retains                {self.retains}",
            f"late credit copies     {dict(self.late_copies)}",
            f"violations             {len(self.violations)}",
            *self.violations[:20],
        ])  # fmt: skip


class _Dice:
    """Kills the worker at random, while armed."""

    def __init__(self, seed: int, rate: float) -> None:
        self.random = random.Random(seed)
        self.rate = rate
        self.armed = True
        self.crashes = 0
        self.lock = threading.Lock()

    def roll(self, where: str) -> None:
        with self.lock:
            hit = self.armed and self.random.random() < self.rate
            self.crashes += hit
        if hit:
            raise Crash(where)


def _dying(cls: type[Any], names: tuple[str, ...], dice: _Dice) -> type[Any]:
    """A subclass of ``cls`` whose ``names`` may kill the worker before or after."""

    def wrap(name: str) -> Callable[..., Any]:
        original = getattr(cls, name)

        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            dice.roll(f"before {name}")
            result = original(self, *args, **kwargs)
            dice.roll(f"after {name}")
            return result

        return call

    return type(f"Dying{cls.__name__}", (cls,), {name: wrap(name) for name in names})


class _Publisher(InMemoryPublisher):
    """Collects outputs; may die halfway through a call."""

    def __init__(self, dice: _Dice) -> None:
        super().__init__()
        self.dice = dice

    def publish(self, messages: Any) -> None:
        super().publish(messages[: len(messages) // 2])
        self.dice.roll("halfway through publishing")
        super().publish(messages[len(messages) // 2 :])


def run_tokens(config: TokenChaosConfig, connection_string: str) -> TokenReport:
    name = f"tokenchaos{random.Random(config.seed).getrandbits(32):08x}"
    table = TableServiceClient.from_connection_string(connection_string).create_table(name)
    try:
        return _run(config, table)
    finally:
        TableServiceClient.from_connection_string(connection_string).delete_table(name)


def _run(config: TokenChaosConfig, table: TableClient) -> TokenReport:
    picks = random.Random(config.seed)
    dice = _Dice(config.seed, config.crash_rate)
    publisher = _Publisher(dice)
    store = _dying(StateStore, ("open", "find", "read", "write"), dice)(table, accounts.name, FAST)
    processor = Processor(accounts, table, publisher, retry=FAST, store=store, tokens=True)
    assert processor._tokens is not None
    rows = _dying(TokenRows, ("register", "create", "record", "finish"), dice)(store)
    processor._tokens.rows = rows
    senders = [f"s{n}" for n in range(config.senders)]
    receivers = [f"r{n}" for n in range(config.receivers)]
    pending: dict[str, list[Message]] = defaultdict(list)
    lock = threading.Lock()
    report = TokenReport()
    sent = 0
    forwarded = [0]  # how many of the publisher's deliveries the broker has taken

    def forward() -> None:
        with lock:
            fresh = publisher.deliveries[forwarded[0] :]
            forwarded[0] += len(fresh)
            for m in fresh:
                if m.type == "Credit":
                    pending[m.key] += [m] * picks.randint(1, 2)  # the broker's copies

    def one_batch(most: int = 5) -> bool:
        with lock:
            keys = [k for k, ms in pending.items() if ms]
            if not keys:
                return False
            key = picks.choice(keys)
            batch = pending[key][: picks.randint(1, most)]
            del pending[key][: len(batch)]
        try:
            processor.process_batch(key, batch)
            if key in receivers and picks.random() < config.retain_rate:
                processor.retain(key, keep_last=1)
                report.retains += 1
        except Crash:
            with lock:
                pending[key][:0] = batch  # not acknowledged: it comes again
        forward()
        with lock:
            report.deliveries += len(batch)
        return True

    def work(until: float) -> None:
        while time.monotonic() < until:
            if not one_batch():
                time.sleep(0.01)

    until = time.monotonic() + config.duration
    workers = [threading.Thread(target=work, args=(until,)) for _ in range(config.threads)]
    for worker in workers:
        worker.start()
    while time.monotonic() < until:  # new transfers, each one to three times
        source, target = picks.choice(senders), picks.choice(receivers)
        transfer = Message(f"t-{sent}", source, "Transfer", {"to": target, "amount": 1 + sent % 7})
        with lock:
            pending[source] += [transfer] * picks.randint(1, 3)
        sent += 1
        time.sleep(config.interval)
    for worker in workers:
        worker.join()
    dice.armed = False
    while one_batch(most=50):  # drained without faults, in larger batches
        pass
    for key in senders + receivers:  # all it may: what attempts left goes with the versions
        processor.retain(key, keep_last=0)
    late: dict[str, list[Message]] = defaultdict(list)
    for credit in (m for m in publisher.deliveries if m.type == "Credit"):
        late[credit.key] += [credit, credit]
    for key, copies in late.items():  # the whole queue again, twice, after retention
        for outcome in processor.process_batch(key, copies):
            report.late_copies[outcome.kind] += 1
    report.crashes = dice.crashes
    _check(processor, table, senders, receivers, publisher, report)
    return report


def _check(
    p: Processor[Any],
    table: TableClient,
    senders: list[str],
    receivers: list[str],
    publisher: InMemoryPublisher,
    report: TokenReport,
) -> None:
    credits = {m.id: m for m in publisher.deliveries if m.type == "Credit"}
    expected: Counter[str] = Counter()
    for sender in senders:
        stored = -p.current_state(sender).state.balance
        outgoing = sum(m.body["amount"] for m in credits.values() if m.body["from"] == sender)
        report.transfers += sum(1 for m in credits.values() if m.body["from"] == sender)
        if stored != outgoing:
            report.violations.append(f"{sender} debited {stored}, its credits hold {outgoing}")
    for credit in credits.values():
        expected[credit.key] += credit.body["amount"]
    for receiver in receivers:
        balance = p.current_state(receiver).state.balance
        if balance != expected[receiver]:
            report.violations.append(f"{receiver} holds {balance}, credited {expected[receiver]}")
    if publisher.divergent:
        report.violations.append(f"{len(publisher.divergent)} outputs went out with other content")
    if set(report.late_copies) - {"consumed", "duplicate"}:
        report.violations.append(f"late credit copies: {dict(report.late_copies)}")
    for key in senders + receivers:
        left = sorted(
            k for k in _row_keys(table, key) if "|TK-" in k or "|TR-" in k
        )  # every token consumed, every registration gone
        if left:
            report.violations.append(f"{key} keeps {left}")


def _row_keys(table: TableClient, key: str) -> list[str]:
    partition = Partition(table, key)
    found = table.query_entities("PartitionKey eq @pk", parameters={"pk": partition.key})
    return [str(e["RowKey"]) for e in found if not is_stream_row_key(str(e["RowKey"]))]
