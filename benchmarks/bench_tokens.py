"""Tokens (de-duplication without a window): what they cost and what they save.

One workload of key-to-key messages, the ``accounts`` handler of
``handlers.examples``: transfers on sender keys, each sending a ``Credit`` to
a receiver key (and a ``Transferred`` to outside, which carries no token),
then the credits processed on the receivers. Every figure with tokens is
beside the same work without, in the same run.

- ``tokens.requests.sender`` / ``tokens.requests.receiver``: HTTP requests
  (counted at the wire client, below every layer of ours) for one transfer
  and for its credit, processed with ``process`` on keys a ``HeaderCache``
  knows, as a user's one-message calls pay them.
- ``tokens.process_batch.requests.sender`` / ``.receiver``: requests per
  message in the batch workload (each sender's transfers to several
  receivers in one ``process_batch``, then each receiver's credits in one).
- ``tokens.process_batch.sender`` / ``.receiver`` / ``.end_to_end``:
  ``process_batch`` throughput on that workload, tokens on beside off
  (paired repeats, alternating which goes first).
- ``tokens.rows_per_key.sender`` / ``.receiver`` and
  ``tokens.bytes_per_key.*``: what one sender and one receiver key store
  after N transfers between them, with tokens and ``retain(keep_last=1)``,
  beside the same without tokens under a 7-day window
  (``retain(older_than=7 days)``, which keeps every version of those days):
  the storage a team saves. The credits are then delivered again: with
  tokens every copy is answered ``consumed`` and no balance changes.

Run: ``python benchmarks/bench_tokens.py [--quick]``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from _common import account, check, emit, entity_bytes, log, paired, quick
from azure.data.tables import TableClient, TableServiceClient

from handlers import HeaderCache, InMemoryPublisher, Message, Processor
from handlers.examples import Account, accounts
from streamstone_py import TableConfig

#: The row keys of the token rows beside a key's stream (tokens, registrations, checkpoints).
TOKEN_ROWS = tuple(f"{accounts.name}|{kind}-" for kind in ("TK", "TR", "TC"))
WINDOW = timedelta(days=7)


class Requests:
    """Counts the HTTP requests a wire client sends (its ``raw_request_hook``)."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()  # the engine reads in parallel threads

    def __call__(self, call: Any) -> None:
        with self._lock:
            self.count += 1


def counted_table(connection_string: str, table_name: str) -> tuple[TableClient, Requests]:
    requests = Requests()
    config = TableConfig(table_name, connection_string=connection_string)
    return config.table_client(raw_request_hook=requests), requests


def credits(publisher: InMemoryPublisher) -> list[Message]:
    return [m for m in publisher.deliveries if m.type == "Credit"]


def partition(table: TableClient, key: str) -> list[dict[str, Any]]:
    rows = table.query_entities("PartitionKey eq @pk", parameters={"pk": key})
    return [dict(r) for r in rows]


def token_rows(table: TableClient, key: str) -> list[str]:
    return [r["RowKey"] for r in partition(table, key) if r["RowKey"].startswith(TOKEN_ROWS)]


def balance(p: Processor[Account], key: str) -> int:
    return p.current_state(key).state.balance


def bench_one_message(table: TableClient, requests: Requests, repeats: int) -> None:
    """One transfer and its credit, each with ``process``, on keys a
    ``HeaderCache`` already knows (a deposit on each first)."""
    spent: dict[bool, tuple[list[float], list[float]]] = {True: ([], []), False: ([], [])}
    for _ in range(repeats):
        for tokens in (True, False):
            tag = uuid.uuid4().hex[:8]
            a, b = f"one-{tag}-a", f"one-{tag}-b"
            publisher = InMemoryPublisher()
            p = Processor(accounts, table, publisher, tokens=tokens, cache=HeaderCache())
            p.process(Message(f"{a}-dep", a, "Deposit", {"amount": 100}))
            p.process(Message(f"{b}-dep", b, "Deposit", {"amount": 1}))
            before = requests.count
            sent = p.process(Message(f"{a}-t", a, "Transfer", {"to": b, "amount": 30}))
            sender = requests.count - before
            [credit] = credits(publisher)
            before = requests.count
            received = p.process(credit)
            receiver = requests.count - before
            check(
                (sent.kind, received.kind) == ("completed", "completed"),
                f"one message, tokens={tokens}: {sent.kind}, {received.kind}",
            )
            check(balance(p, b) == 31, f"one message, tokens={tokens}: B has {balance(p, b)}")
            check(("ss-token" in credit.headers) == tokens, f"tokens={tokens}: credit's header")
            spent[tokens][0].append(sender)
            spent[tokens][1].append(receiver)
    for n, side in enumerate(("sender", "receiver")):
        emit(
            f"tokens.requests.{side}", "requests/message", "lower", spent[True][n],
            "without tokens", spent[False][n], {"messages": 1, "cache": "HeaderCache"},
        )  # fmt: skip


def workload(tag: str, senders: int, receivers: int, per_key: int) -> dict[str, list[Message]]:
    """Each sender's transfers, round robin over the receivers."""
    work: dict[str, list[Message]] = {}
    for s in range(senders):
        key = f"{tag}-s{s}"
        work[key] = [
            Message(
                f"{key}-t{n}", key, "Transfer",
                {"to": f"{tag}-r{(s + n) % receivers}", "amount": 1 + n % 7},
            )
            for n in range(per_key)
        ]  # fmt: skip
    return work


def bench_throughput(
    table: TableClient, requests: Requests, size: tuple[int, int, int], repeats: int
) -> None:
    senders, receivers, per_key = size
    total = senders * per_key
    # tokens -> (sender s, receiver s, sender requests/message, receiver requests/message)
    runs: dict[bool, list[tuple[float, float, float, float]]] = {True: [], False: []}

    def run(tokens: bool) -> float:
        tag = f"tp{uuid.uuid4().hex[:8]}{'t' if tokens else 'n'}"
        work = workload(tag, senders, receivers, per_key)
        publisher = InMemoryPublisher()
        p = Processor(accounts, table, publisher, tokens=tokens)
        before, start = requests.count, time.perf_counter()
        for key, messages in work.items():
            p.process_batch(key, messages)
        sending, sent = time.perf_counter() - start, requests.count - before
        to: dict[str, list[Message]] = defaultdict(list)
        for credit in credits(publisher):
            to[credit.key].append(credit)
        before, start = requests.count, time.perf_counter()
        for key, messages in to.items():
            p.process_batch(key, messages)
        receiving, received = time.perf_counter() - start, requests.count - before
        check(p.stats.completed == 2 * total, f"tokens={tokens}: {p.stats.completed} completed")
        check(sum(map(len, to.values())) == total, f"tokens={tokens}: credits missing")
        check(
            all(("ss-token" in c.headers) == tokens for m in to.values() for c in m),
            f"tokens={tokens}: a credit's token header",
        )
        owed: dict[str, int] = defaultdict(int)
        for messages in work.values():
            for m in messages:
                owed[m.body["to"]] += m.body["amount"]
        found = {key: balance(p, key) for key in owed}
        check(found == owed, f"tokens={tokens}: receivers hold {found}, owed {owed}")
        if tokens:
            left = [r for key in owed for r in token_rows(table, key)]
            check(not left, f"tokens left on the receivers: {left[:3]}")
        runs[tokens].append((sending, receiving, sent / total, received / total))
        return sending + receiving

    log(f"throughput: {senders} senders x {per_key} transfers to {receivers} receivers")
    paired(lambda _: run(True), lambda _: run(False), repeats)
    params = {"senders": senders, "receivers": receivers, "transfers_per_sender": per_key}
    on, off = runs[True], runs[False]

    def rates(series: list[tuple[float, float, float, float]], seconds: Any) -> list[float]:
        return [total / seconds(r) for r in series]

    for side, seconds in (
        ("sender", lambda r: r[0]),
        ("receiver", lambda r: r[1]),
        ("end_to_end", lambda r: r[0] + r[1]),
    ):
        emit(
            f"tokens.process_batch.{side}", "messages/s", "higher", rates(on, seconds),
            "without tokens", rates(off, seconds), params,
        )  # fmt: skip
    for n, side in ((2, "sender"), (3, "receiver")):
        emit(
            f"tokens.process_batch.requests.{side}", "requests/message", "lower",
            [r[n] for r in on], "without tokens", [r[n] for r in off], params,
        )  # fmt: skip


def transfers(
    table: TableClient, tokens: bool, count: int
) -> tuple[Processor[Account], list[Message], str, str]:
    """``count`` transfers from A to B, each credit delivered: 500 a batch."""
    tag = f"rows{uuid.uuid4().hex[:8]}{'t' if tokens else 'n'}"
    a, b = f"{tag}-a", f"{tag}-b"
    publisher = InMemoryPublisher()
    p = Processor(accounts, table, publisher, tokens=tokens)
    work = [Message(f"{a}-t{n}", a, "Transfer", {"to": b, "amount": 1}) for n in range(count)]
    for start in range(0, count, 500):
        p.process_batch(a, work[start : start + 500])
    sent = credits(publisher)
    for start in range(0, count, 500):
        p.process_batch(b, sent[start : start + 500])
    check(p.stats.completed == 2 * count, f"rows, tokens={tokens}: {p.stats.completed} completed")
    check(balance(p, b) == count, f"rows, tokens={tokens}: B holds {balance(p, b)}")
    return p, sent, a, b


def redeliver(p: Processor[Account], b: str, copies: Sequence[Message], count: int) -> None:
    """Every credit again after the cut: the kept version answers the newest,
    the tokens' absence every other; the balance stays."""
    outcomes = [o for s in range(0, count, 500) for o in p.process_batch(b, copies[s : s + 500])]
    kinds = [o.kind for o in outcomes]
    check(
        kinds[:-1] == ["consumed"] * (count - 1) and kinds[-1] == "duplicate",
        f"copies after keep_last=1 with tokens: {sorted(set(kinds))}",
    )
    check(balance(p, b) == count, f"copies after the cut changed B: {balance(p, b)}")


def bench_rows(table: TableClient, count: int) -> None:
    stored: dict[bool, dict[str, list[dict[str, Any]]]] = {}
    for tokens in (True, False):
        log(f"rows: {count} transfers, tokens={tokens}")
        p, copies, a, b = transfers(table, tokens, count)
        if tokens:
            removed = (p.retain(a, keep_last=1), p.retain(b, keep_last=1))
            check(min(removed) >= count - 3, f"keep_last=1 with tokens removed only {removed}")
            redeliver(p, b, copies, count)
        else:
            removed = (p.retain(a, older_than=WINDOW), p.retain(b, older_than=WINDOW))
            check(removed == (0, 0), f"a 7-day window removed {removed} of today's versions")
        stored[tokens] = {"sender": partition(table, a), "receiver": partition(table, b)}
    for side in ("sender", "receiver"):
        on, off = stored[True][side], stored[False][side]
        check(len(off) == 1 + 2 * count, f"{side} without tokens: {len(off)} rows")
        check(len(on) <= 10, f"{side} with tokens and keep_last=1: {len(on)} rows")
        params = {"messages": count, "tokens": "keep_last=1", "peer": "older_than=7 days"}
        emit(
            f"tokens.rows_per_key.{side}", "rows", "lower", [float(len(on))],
            "without tokens, a 7-day window", [float(len(off))], params,
        )  # fmt: skip
        emit(
            f"tokens.bytes_per_key.{side}", "bytes", "lower",
            [float(sum(map(entity_bytes, on)))], "without tokens, a 7-day window",
            [float(sum(map(entity_bytes, off)))], params,
        )  # fmt: skip


def main() -> int:
    is_quick = quick(__doc__)
    repeats = 5
    size = (5, 5, 40) if is_quick else (20, 20, 50)
    count = 300 if is_quick else 10_000
    with account() as connection_string:
        service = TableServiceClient.from_connection_string(connection_string)
        name = "benchtokens" + uuid.uuid4().hex[:8]
        service.create_table(name)
        table, requests = counted_table(connection_string, name)
        bench_one_message(table, requests, 3)
        bench_throughput(table, requests, size, repeats)
        bench_rows(table, count)
        service.delete_table(name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
