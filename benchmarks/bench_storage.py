"""Storage: compressed states, and retention inside the job.

- ``storage.codec.ratio`` / ``storage.codec.time``: the codecs on offer over
  realistic encoded states (a portfolio dataclass of 1 KB, 10 KB and 100 KB):
  compressed size beside the raw size, and the time of one compression plus
  one decompression beside zlib at level 1 (the one the runtime uses).
- ``storage.compression.bytes`` / ``storage.compression.throughput``: stored
  bytes per message (Azure's entity-size formula over every row of the key)
  and messages per second of ``process_batch`` with ``compression="zlib"``,
  beside the same messages processed without compression.
- ``storage.retention.rows_per_key`` / ``storage.retention.throughput``: the
  task body (``process_partition``) over 20 micro-batches of 2 messages per
  key, with ``keep_last=4`` beside no retention: rows per key after each
  batch (the storage bound) and messages per second over all the batches
  (the cost).
- ``storage.retention.batched.max_rows_per_key`` /
  ``storage.retention.batched.throughput``: the same with
  ``retain_at_least=8`` (a key is cut once 8 versions can go): the most rows
  per key over the batches, and messages per second, beside no retention.

Run: ``python benchmarks/bench_storage.py [--quick]``.
"""

from __future__ import annotations

import bz2
import functools
import json
import lzma
import statistics
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from _common import account, check, emit, entity_bytes, log, paired, quick
from azure.data.tables import TableClient, TableServiceClient

from handlers import HandlerContext, InMemoryPublisher, Message, Processor, handler
from handlers._compression import Compression, pack_stored
from spark_driver import JobSettings
from spark_driver._tasks._executor import process_partition

#: Positions per state for each nominal size (about 100 bytes each, encoded).
SIZES = {"1KB": 9, "10KB": 90, "100KB": 900}
#: A codec: compress, decompress.
Codec = tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]
SYMBOLS = ["MSFT", "AAPL", "NVDA", "AMZN", "GOOG", "META", "ASML", "SAP", "NOVO", "SHEL"]


@dataclass
class Portfolio:
    owner: str = ""
    currency: str = "EUR"
    positions: list[dict[str, Any]] = field(default_factory=list)
    trades: int = 0


@handler("Portfolio", Portfolio, types=["Trade"])
def portfolio(state: Portfolio, message: Message, ctx: HandlerContext) -> None:
    """Keeps ``size`` positions; each trade changes one of them."""
    rng = ctx.random()
    size = message.body["positions"]
    state.owner = message.key
    while len(state.positions) < size:
        n = len(state.positions)
        state.positions.append({
            "symbol": SYMBOLS[n % len(SYMBOLS)], "account": f"acc-{n % 7:04d}",
            "quantity": 0, "average_price": 0.0, "opened": "2026-01-02", "status": "open",
        })  # fmt: skip
    position = state.positions[state.trades % size]
    position["quantity"] += rng.randrange(1, 500)
    position["average_price"] = round(rng.uniform(10, 900), 2)
    position["opened"] = ctx.now().date().isoformat()
    state.trades += 1


def encoded_state(positions: int) -> bytes:
    """The encoded state after ``positions`` trades: every position filled once."""
    state = Portfolio()
    for n in range(positions):
        message = Message(f"m-{n}", "owner-1", "Trade", {"positions": positions})
        context = HandlerContext(message, handler="Portfolio", now=datetime(2026, 5, 4, tzinfo=UTC))
        state = portfolio.apply(state, message, context)
    return portfolio.encode_state(state)


def codecs() -> dict[str, Codec]:
    found: dict[str, Codec] = {
        "zlib-1": (lambda d: zlib.compress(d, 1), zlib.decompress),
        "zlib-6": (lambda d: zlib.compress(d, 6), zlib.decompress),
        "lzma-0": (lambda d: lzma.compress(d, preset=0), lzma.decompress),
        "bz2-9": (lambda d: bz2.compress(d, 9), bz2.decompress),
    }
    try:
        import zstandard  # type: ignore[import-not-found,unused-ignore]

        compressor = zstandard.ZstdCompressor(level=3)
        decompressor = zstandard.ZstdDecompressor()
        found["zstd-3"] = (compressor.compress, decompressor.decompress)
    except ImportError:
        log("zstandard is not installed: not measured")
    return found


def round_trip_us(_repeat: int, raw: bytes, codec: Codec) -> float:
    """Microseconds of one compression and one decompression of ``raw``."""
    pack, unpack = codec
    loops = max(1, 200_000 // len(raw))
    start = time.perf_counter()
    for _ in range(loops):
        check(unpack(pack(raw)) == raw, "a codec changed the state")
    return (time.perf_counter() - start) / loops * 1e6


def bench_codecs(repeats: int) -> None:
    available = codecs()
    reference = available["zlib-1"]
    for size, positions in SIZES.items():
        raw = encoded_state(positions)
        for name, codec in available.items():
            emit(
                "storage.codec.ratio", "bytes", "lower", [float(len(codec[0](raw)))],
                "raw encoded state", [float(len(raw))], {"codec": name, "state": size},
            )  # fmt: skip
            mine, zlib1 = paired(
                functools.partial(round_trip_us, raw=raw, codec=codec),
                functools.partial(round_trip_us, raw=raw, codec=reference),
                repeats,
            )
            emit(
                "storage.codec.time", "µs", "lower", mine, "zlib-1", zlib1,
                {"codec": name, "state": size, "raw_bytes": len(raw)},
            )  # fmt: skip


def stored_bytes(table: TableClient, key: str) -> int:
    rows = table.query_entities("PartitionKey eq @pk", parameters={"pk": key})
    return sum(entity_bytes(dict(r)) for r in rows)


def compression_run(
    table: TableClient, compression: Compression, positions: int, keys: int, messages: int
) -> tuple[float, float]:
    """Messages per second over fresh keys (5 messages to a batch), and stored bytes
    per message."""
    p = Processor(portfolio, table, InMemoryPublisher(), compression=compression)
    label = compression or "none"
    work = []
    for k in range(keys):
        key = f"{label}-{positions}-{k}-{uuid.uuid4().hex[:8]}"
        body = {"positions": positions}
        work.append((key, [Message(f"{key}-{n}", key, "Trade", body) for n in range(messages)]))
    start = time.perf_counter()
    for key, batch in work:
        for first in range(0, messages, 5):
            p.process_batch(key, batch[first : first + 5])
    seconds = time.perf_counter() - start
    check(p.stats.completed == keys * messages, f"{label} {positions}: {p.stats}")
    per_message = statistics.mean(stored_bytes(table, key) for key, _ in work) / messages
    return keys * messages / seconds, per_message


def bench_compression(table: TableClient, keys: int, messages: int, repeats: int) -> None:
    for size, positions in SIZES.items():
        runs: dict[str, list[tuple[float, float]]] = {"zlib": [], "none": []}
        for i in range(repeats):
            order: list[Compression] = ["zlib", None] if i % 2 == 0 else [None, "zlib"]
            for compression in order:
                run = compression_run(table, compression, positions, keys, messages)
                runs[compression or "none"].append(run)
        params = {"state": size, "keys": keys, "messages_per_key": messages}
        zipped, plain = runs["zlib"], runs["none"]
        emit("storage.compression.bytes", "bytes/message", "lower", [r[1] for r in zipped],
             "no compression", [r[1] for r in plain], params)  # fmt: skip
        emit("storage.compression.throughput", "msg/s", "higher", [r[0] for r in zipped],
             "no compression", [r[0] for r in plain], params)  # fmt: skip
        raw = encoded_state(positions)
        check(len(pack_stored(raw, "zlib")) * 2 <= len(raw), f"{size}: not halved")


def batch_rows(keys: list[str], batch: int, per_key: int) -> list[dict[str, Any]]:
    return [
        {"message_id": f"{key}-{batch}-{n}", "key": key, "type": "FireAt",
         "body": json.dumps({"position": (batch * 7 + n) % 100})}
        for key in keys
        for n in range(per_key)
    ]  # fmt: skip


def rows_per_key(table: TableClient, keys: list[str]) -> float:
    query = "PartitionKey eq @pk"
    found = [table.query_entities(query, parameters={"pk": k}, select=["RowKey"]) for k in keys]
    return statistics.mean(sum(1 for _ in rows) for rows in found)


#: ``retain_at_least`` of the batched retention: a cut every 4 batches here.
AT_LEAST = 8


def bench_retention(service: TableServiceClient, keys: int, batches: int) -> None:
    labels = ("keep", "batched", "all")
    tables = {label: service.create_table("benchretain" + uuid.uuid4().hex[:8]) for label in labels}
    settings = {
        "keep": JobSettings(table=tables["keep"].table_name, handler="shooting_range",
                            keep_last=4),
        "batched": JobSettings(table=tables["batched"].table_name, handler="shooting_range",
                               keep_last=4, retain_at_least=AT_LEAST),
        "all": JobSettings(table=tables["all"].table_name, handler="shooting_range"),
    }  # fmt: skip
    names = [f"game-{k:05d}" for k in range(keys)]
    sample = names[:: max(1, keys // 10)]
    per_key = 2
    # Seconds per batch: a throughput is all messages over all the time, as a
    # batched retention pays for its cuts in a few batches only.
    seconds: dict[str, list[float]] = {label: [] for label in labels}
    most = 0.0
    for b in range(batches):
        rows = batch_rows(names, b, per_key)
        # Each batch runs all three, the one first that went last before.
        order = labels[b % 3 :] + labels[: b % 3]
        for label in order:
            start = time.perf_counter()
            results = list(process_partition(rows, settings[label]))
            seconds[label].append(time.perf_counter() - start)
            check(sum(r[4] == "completed" for r in results) == len(rows), f"{label}: {results[:3]}")
        kept, everything = rows_per_key(tables["keep"], sample), rows_per_key(tables["all"], sample)
        most = max(most, rows_per_key(tables["batched"], sample))
        emit("storage.retention.rows_per_key", "rows/key", "lower", [kept], "no retention",
             [everything], {"batch": b + 1, "keys": keys, "messages_per_key": per_key,
                            "keep_last": 4})  # fmt: skip
    # The header and 2 rows per version (event, id row): the last 4 versions
    # (the last batch's 2 among them) and the one before them.
    check(kept == 1 + 2 * (4 + 1), f"retention left {kept} rows per key")
    check(everything == 1 + 2 * per_key * batches, f"no retention: {everything} rows per key")
    messages = batches * keys * per_key
    rates = {label: [messages / sum(seconds[label])] for label in labels}
    emit("storage.retention.throughput", "msg/s", "higher", rates["keep"], "no retention",
         rates["all"], {"batches": batches, "keys": keys, "messages_per_key": per_key,
                        "keep_last": 4})  # fmt: skip
    batched = {"batches": batches, "keys": keys, "messages_per_key": per_key, "keep_last": 4,
               "at_least": AT_LEAST}  # fmt: skip
    emit("storage.retention.batched.max_rows_per_key", "rows/key", "lower", [most],
         "no retention, last batch", [everything], batched)  # fmt: skip
    # At most the 4 versions, the one before, and AT_LEAST - 1 waiting to go.
    check(most <= 1 + 2 * (4 + 1 + AT_LEAST - 1), f"batched retention left {most} rows per key")
    emit("storage.retention.batched.throughput", "msg/s", "higher", rates["batched"],
         "no retention", rates["all"], batched)  # fmt: skip
    for table in tables.values():
        service.delete_table(table.table_name)


def main() -> int:
    is_quick = quick(__doc__)
    with account() as connection_string:
        service = TableServiceClient.from_connection_string(connection_string)
        bench_codecs(3 if is_quick else 7)
        table = service.create_table("benchcompress" + uuid.uuid4().hex[:8])
        bench_compression(
            table, 5 if is_quick else 10, 10 if is_quick else 20, 3 if is_quick else 5
        )
        service.delete_table(table.table_name)
        bench_retention(service, 50 if is_quick else 200, 5 if is_quick else 20)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
