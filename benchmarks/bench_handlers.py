"""The consistent-messaging runtime: load_state cost vs stream length, and throughput.

- ``handlers.load_state``: latency of ``Processor.load_state`` at stream
  lengths 10, 1,000 and 10,000, for a new message and for a duplicate, beside
  the seed's replay (read the stream from the start until the message's own
  version). Then the growth of ours from the shortest to the longest stream
  (target: within 1.3x), beside the growth of the replay.
- ``handlers.load_state.raw_read``: a hand-signed point read of the header
  (no SDK, no engine) at each length, beside the shortest's; and
  ``handlers.load_state.new.again``: the shortest stream's load_state again
  once the longest is written, beside its first measurement. Together they
  tell a step of the stream's length from one of Azurite's own.
- ``handlers.process`` / ``handlers.process_batch`` / ``handlers.outbox``:
  messages per second and storage round trips (HTTP requests, counted at the
  transport) per message, for ``process`` one by one, ``process_batch`` with
  20 messages per key, and the outbox strategy with the same batches
  (target: ``process_batch`` at most 0.2 round trips per message), beside a
  naive handler that reads its state row, applies the message and writes the
  row back, with no de-duplication at all (the cost of exactly-once).
- ``handlers.scaling.keys``: ``process_batch`` throughput over the same
  number of messages spread over 10, 100, 1,000 and 10,000 keys, beside 10 keys.
- ``handlers.storage_bytes``: bytes stored per processed message (Azure's
  entity-size formula over every row of the key's partition) at state sizes
  from 100 B to 100 KB, beside the state size itself.

Run: ``python benchmarks/bench_handlers.py [--quick]``.
"""

from __future__ import annotations

import statistics
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from _common import (
    CountingTransport,
    account,
    check,
    emit,
    entity_bytes,
    log,
    quick,
    raw_get,
    timed,
)
from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import TableClient, TableServiceClient

from handlers import HandlerContext, InMemoryPublisher, Message, Processor, handler
from handlers._outcome import StrategyName
from handlers.examples import shooting_range
from handlers.testing import replay_load  # the seed's LoadState, the tests' oracle


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
    keys: dict[int, str] = {}
    raw: dict[int, list[float]] = {}
    for length in lengths:
        key = keys[length] = f"len{length}-{uuid.uuid4().hex[:8]}"
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
        # One raw point read of the header (a hand-signed GET, no SDK, no engine):
        # what the server's answer costs at this length, beside the shortest's.
        raw[length] = median_ms(lambda k=key: raw_get(table, k, "ShootingRange|SS-HEAD"), repeats)
        emit(
            "handlers.load_state.raw_read", "ms", "lower", raw[length],
            f"the same read at {lengths[0]} versions", raw[lengths[0]],
            {"versions": length},
        )  # fmt: skip
    shortest, longest = lengths[0], lengths[-1]
    # Is a step the stream's length, or Azurite's? The shortest stream's
    # load_state once more, now that the longest exists, beside its first.
    first_key = keys[shortest]
    again = median_ms(lambda: p.load_state(first_key, "never-seen"), repeats)
    emit(
        "handlers.load_state.new.again", "ms", "lower", again,
        f"the same call at {shortest} versions, before the longer streams were written",
        ours["new"][shortest], {"versions": shortest, "written_since": sum(lengths[1:])},
    )  # fmt: skip

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

    def run(name: str, strategy: StrategyName, batched: bool) -> None:
        rates, trips = [], []
        for _ in range(repeats):
            publisher = InMemoryPublisher()
            p = Processor(shooting_range, table, publisher, strategy=strategy)
            work: dict[str, list[Message]] = {
                f"{name}-{uuid.uuid4().hex[:8]}-{k}": [] for k in range(keys)
            }
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

    def naive() -> None:
        """Read the state row, apply, write it back: no message ids, no versions."""
        rates, trips = [], []
        for _ in range(repeats):
            publisher = InMemoryPublisher()
            work: dict[str, list[Message]] = {
                f"naive-{uuid.uuid4().hex[:8]}-{k}": [] for k in range(keys)
            }
            before = transport.requests
            start = time.perf_counter()
            for key in work:
                for message in messages_for(key, per_key):
                    try:
                        row = table.get_entity(key, "state")
                        state = shooting_range.decode_state(row["State"])
                    except ResourceNotFoundError:
                        state = shooting_range.initial_state()
                    context = HandlerContext(message, handler="naive", now=datetime.now(UTC))
                    state = shooting_range.apply(state, message, context)
                    encoded = shooting_range.encode_state(state)
                    table.upsert_entity({"PartitionKey": key, "RowKey": "state", "State": encoded})
                    publisher.publish(context.outputs)
            elapsed = time.perf_counter() - start
            total = keys * per_key
            check(len(publisher.messages) == keys * (per_key - 1), "naive: outputs missing")
            rates.append(total / elapsed)
            trips.append((transport.requests - before) / total)
        runs["naive"] = (rates, trips)

    log(f"throughput: {keys} keys x {per_key} messages x {repeats} repeats")
    naive()
    run("one_by_one", "state", batched=False)
    run("batch", "state", batched=True)
    run("outbox", "outbox", batched=True)
    params = {"keys": keys, "messages_per_key": per_key}
    one, batch, outbox, bare = runs["one_by_one"], runs["batch"], runs["outbox"], runs["naive"]
    naive_peer = "naive read-modify-write, no de-duplication"
    emit("handlers.process", "messages/s", "higher", one[0], naive_peer, bare[0], params)
    emit(
        "handlers.process_batch.vs_naive", "messages/s", "higher", batch[0],
        naive_peer, bare[0], params,
    )  # fmt: skip
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
    emit(
        "handlers.process.round_trips", "requests/message", "lower", one[1],
        naive_peer, bare[1], params,
    )  # fmt: skip
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


def bench_keys(service: TableServiceClient, counts: list[int], total: int, repeats: int) -> None:
    """The same messages over more and more keys: fewer messages per batch.

    Each repeat gets a fresh table: Azurite's queries slow down as one table
    grows, which would be charged to the larger key counts otherwise."""
    series: dict[int, list[float]] = {}
    for count in counts:
        log(f"keys: {total} messages over {count} keys x {repeats} repeats")
        rates = []
        for _ in range(repeats):
            table = service.create_table("benchkeys" + uuid.uuid4().hex[:8])
            p = Processor(shooting_range, table, InMemoryPublisher())
            tag = uuid.uuid4().hex[:8]
            work = [messages_for(f"k{tag}-{k}", total // count) for k in range(count)]
            start = time.perf_counter()
            for messages in work:
                p.process_batch(messages[0].key, messages)
            rates.append(total / (time.perf_counter() - start))
            check(p.stats.completed == total, f"{count} keys: {p.stats.completed} of {total}")
            service.delete_table(table.table_name)
        series[count] = rates
        emit(
            "handlers.scaling.keys", "messages/s", "higher", rates,
            f"{counts[0]} keys" if count != counts[0] else None,
            series[counts[0]] if count != counts[0] else None,
            {"keys": count, "messages": total},
        )  # fmt: skip


@handler("Blob", None, types=["Grow"])
def blob(state: dict[str, Any], message: Message, ctx: HandlerContext) -> None:
    state["n"] = state.get("n", 0) + 1
    state["blob"] = ctx.random().randbytes(message.body["size"])


def bench_bytes(table: TableClient, sizes: list[int], messages: int) -> None:
    """Storage per processed message: each version keeps the whole state."""
    for size in sizes:
        key = f"bytes{size}-{uuid.uuid4().hex[:8]}"
        p: Processor[dict[str, Any]] = Processor(blob, table, InMemoryPublisher())
        work = [Message(f"{key}-{n}", key, "Grow", {"size": size}) for n in range(messages)]
        for start in range(0, messages, 10):
            p.process_batch(key, work[start : start + 10])
        check(p.stats.completed == messages, f"state size {size}: {p.stats.completed} processed")
        rows = list(table.query_entities("PartitionKey eq @pk", parameters={"pk": key}))
        check(len(rows) == 1 + 2 * messages, f"state size {size}: {len(rows)} rows")
        per_message = sum(entity_bytes(dict(r)) for r in rows) / messages
        emit(
            "handlers.storage_bytes", "bytes/message", "lower", [per_message],
            "state size", [float(size)], {"state_bytes": size, "messages": messages},
        )  # fmt: skip


def main() -> int:
    is_quick = quick(__doc__)
    lengths = [10, 100, 1_000] if is_quick else [10, 100, 1_000, 10_000, 100_000]
    keys, repeats = (5, 3) if is_quick else (20, 5)
    key_counts = [10, 100, 1_000] if is_quick else [10, 100, 1_000, 10_000]
    key_total = key_counts[-1]
    sizes = [100, 10_000] if is_quick else [100, 1_000, 10_000, 100_000]
    with account() as connection_string:
        service = TableServiceClient.from_connection_string(connection_string)
        table = service.create_table_if_not_exists("benchhandlers" + uuid.uuid4().hex[:8])
        bench_load_state(table, lengths, repeats)
        bench_throughput(connection_string, table.table_name, keys, 20, repeats)
        service.delete_table(table.table_name)
        bench_keys(service, key_counts, key_total, 3)
        table = service.create_table("benchbytes" + uuid.uuid4().hex[:8])
        bench_bytes(table, sizes, 20 if is_quick else 50)
        service.delete_table(table.table_name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
