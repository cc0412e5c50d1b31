"""The consistent-messaging runtime: load_state cost vs stream length, and throughput.

- ``handlers.load_state``: latency of ``Processor.load_state`` at stream
  lengths 10, 1,000 and 10,000, for a new message and for a duplicate, beside
  the seed's replay (read the stream from the start until the message's own
  version). Then the growth of ours from the shortest to the longest stream
  (target: within 1.3x), beside the growth of the replay.
- ``handlers.process`` / ``handlers.process_batch`` / ``handlers.outbox``:
  messages per second and storage round trips (HTTP requests, counted at the
  transport) per message, for ``process`` one by one, ``process_batch`` with
  20 messages per key, and the outbox strategy with the same batches
  (target: ``process_batch`` at most 0.2 round trips per message).

Run: ``python benchmarks/bench_handlers.py [--quick]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

from _common import CountingTransport, account, check, emit, log, machine, timed
from azure.data.tables import TableClient, TableServiceClient

from handlers import InMemoryPublisher, Message, Processor
from handlers.examples import shooting_range
from tests.test_handlers_oracle import replay_load  # the seed's LoadState, the tests' oracle


def messages_for(key: str, count: int, tag: str = "") -> list[Message]:
    out = [Message(f"{key}-{tag}round", key, "StartNewRound")]
    out += [
        Message(f"{key}-{tag}shot-{n}", key, "FireAt", {"position": n % 100})
        for n in range(1, count)
    ]
    return out


def median_ms(fn: Any, repeats: int) -> list[float]:
    return [timed(fn) * 1000 for _ in range(repeats)]


def bench_load_state(table: TableClient, lengths: list[int], repeats: int) -> None:
    p = Processor(shooting_range, table, InMemoryPublisher())
    ours: dict[str, dict[int, list[float]]] = {"new": {}, "duplicate": {}}
    replay: dict[str, dict[int, list[float]]] = {"new": {}, "duplicate": {}}
    for length in lengths:
        key = f"len{length}-{uuid.uuid4().hex[:8]}"
        log(f"load_state: building a stream of {length} versions")
        messages = messages_for(key, length)
        for start in range(0, length, 2000):
            p.process_batch(key, messages[start : start + 2000])
        middle = messages[length // 2].id
        for kind, message_id in (("new", "never-seen"), ("duplicate", middle)):
            mine = p.load_state(key, message_id)
            theirs = replay_load(p, key, message_id)
            found = (mine.state, mine.version, mine.is_duplicate)
            check(found == theirs, f"load_state disagrees with the replay at {length}")
            peer_repeats = repeats if length <= 1000 else 3
            ours[kind][length] = median_ms(lambda k=key, m=message_id: p.load_state(k, m), repeats)
            replay[kind][length] = median_ms(
                lambda k=key, m=message_id: replay_load(p, k, m), peer_repeats
            )
            emit(
                f"handlers.load_state.{kind}", "ms", "lower", ours[kind][length],
                "replay of the stream (the seed's LoadState)", replay[kind][length],
                {"versions": length},
            )  # fmt: skip
    shortest, longest = lengths[0], lengths[-1]

    def growth(series: dict[int, list[float]]) -> float:
        return statistics.median(series[longest]) / statistics.median(series[shortest])

    for kind in ("new", "duplicate"):
        emit(
            f"handlers.load_state.{kind}.growth", "ratio", "lower", [growth(ours[kind])],
            "growth of the replay", [growth(replay[kind])],
            {"from_versions": shortest, "to_versions": longest},
        )  # fmt: skip


def bench_throughput(
    connection_string: str, table_name: str, keys: int, per_key: int, repeats: int
) -> None:
    transport = CountingTransport()
    table = TableClient.from_connection_string(connection_string, table_name, transport=transport)
    runs: dict[str, tuple[list[float], list[float]]] = {}

    def run(name: str, strategy: str, batched: bool) -> None:
        rates, trips = [], []
        for _ in range(repeats):
            publisher = InMemoryPublisher()
            p = Processor(shooting_range, table, publisher, strategy=strategy)  # type: ignore[arg-type]
            work = {f"{name}-{uuid.uuid4().hex[:8]}-{k}": [] for k in range(keys)}
            for key in work:
                work[key] = messages_for(key, per_key)
            before = transport.requests
            start = time.perf_counter()
            for key, messages in work.items():
                if batched:
                    p.process_batch(key, messages)
                else:
                    for message in messages:
                        p.process(message)
            elapsed = time.perf_counter() - start
            total = keys * per_key
            check(p.stats.completed == total, f"{name}: {p.stats.completed} of {total} completed")
            check(len(publisher.messages) == keys * (per_key - 1), f"{name}: outputs missing")
            rates.append(total / elapsed)
            trips.append((transport.requests - before) / total)
        runs[name] = (rates, trips)

    log(f"throughput: {keys} keys x {per_key} messages x {repeats} repeats")
    run("one_by_one", "state", batched=False)
    run("batch", "state", batched=True)
    run("outbox", "outbox", batched=True)
    params = {"keys": keys, "messages_per_key": per_key}
    one, batch, outbox = runs["one_by_one"], runs["batch"], runs["outbox"]
    emit("handlers.process", "messages/s", "higher", one[0], None, None, params)
    emit(
        "handlers.process_batch",
        "messages/s",
        "higher",
        batch[0],
        "process one by one",
        one[0],
        params,
    )
    emit(
        "handlers.outbox",
        "messages/s",
        "higher",
        outbox[0],
        "state-based process_batch",
        batch[0],
        params,
    )
    emit("handlers.process.round_trips", "requests/message", "lower", one[1], None, None, params)
    emit(
        "handlers.process_batch.round_trips",
        "requests/message",
        "lower",
        batch[1],
        "process one by one",
        one[1],
        params,
    )
    emit(
        "handlers.outbox.round_trips",
        "requests/message",
        "lower",
        outbox[1],
        "state-based process_batch",
        batch[1],
        params,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, under a minute")
    args = parser.parse_args()
    log(f"machine: {machine()}")
    lengths = [10, 300, 1_000] if args.quick else [10, 1_000, 10_000]
    keys, repeats = (5, 3) if args.quick else (20, 5)
    with account() as connection_string:
        service = TableServiceClient.from_connection_string(connection_string)
        table = service.create_table_if_not_exists("benchhandlers" + uuid.uuid4().hex[:8])
        bench_load_state(table, lengths, repeats)
        bench_throughput(connection_string, table.table_name, keys, 20, repeats)
        service.delete_table(table.table_name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
