"""Engine cost beside raw azure-data-tables calls of the same rows.

- ``stream.write``: ``Stream.write`` of N events (with ids) to a new stream,
  beside the same rows (header, event rows, id rows) sent as raw entity-group
  transactions of at most 100 operations, each conditional on the header's
  ETag like the engine's.
- ``stream.read``: paging through a stream of M events with ``Stream.read``,
  beside one raw range query over the same event rows.
- ``stream.write.async``: the async client writing to S streams at once
  (``asyncio.gather``), beside the sync client writing them one after another.

Run: ``python benchmarks/bench_stream.py [--quick]``. Target: ratio <= 1.15.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from _common import account, check, emit, log, paired, quick, timed
from azure.core import MatchConditions
from azure.data.tables import TableClient, TableServiceClient, UpdateMode
from azure.data.tables.aio import TableClient as AsyncTableClient

from streamstone_py import EventData, Partition, Stream, aio


def _events(count: int) -> list[EventData]:
    return [
        EventData(
            id=f"m-{i}", properties={"Type": "ItemAdded", "Sku": f"SKU-{i % 97}", "Qty": i % 5}
        )
        for i in range(1, count + 1)
    ]


def _raw_rows(pk: str, events: list[EventData]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The engine's rows for these events, built by hand: (event row, id row)."""
    out = []
    for version, e in enumerate(events, start=1):
        row: dict[str, Any] = {
            "PartitionKey": pk,
            "RowKey": f"SS-SE-{version:010d}",
            **e.properties,
        }
        row.update(Version=version, SS_Id=e.id)
        out.append((row, {"PartitionKey": pk, "RowKey": f"SS-UID-{e.id}", "Version": version}))
    return out


def raw_write(table: TableClient, pk: str, events: list[EventData]) -> None:
    pairs = _raw_rows(pk, events)
    per_batch = 49  # 98 rows + the header = 99 <= 100 operations, as the engine packs them
    etag: str | None = None
    version = 0
    for start in range(0, len(pairs), per_batch):
        chunk = pairs[start : start + per_batch]
        version += len(chunk)
        header = {"PartitionKey": pk, "RowKey": "SS-HEAD", "Version": version}
        ops: list[Any] = (
            [("create", header)]
            if etag is None
            else [
                (
                    "update",
                    header,
                    {
                        "mode": UpdateMode.REPLACE,
                        "etag": etag,
                        "match_condition": MatchConditions.IfNotModified,
                    },
                )
            ]
        )
        for row, id_row in chunk:
            ops += [("create", row), ("create", id_row)]
        etag = table.submit_transaction(ops)[0]["etag"]


def raw_read(table: TableClient, pk: str, count: int) -> list[dict[str, Any]]:
    return list(
        table.query_entities(
            "PartitionKey eq @pk and RowKey ge @first and RowKey le @last",
            parameters={"pk": pk, "first": "SS-SE-0000000001", "last": f"SS-SE-{count:010d}"},
            results_per_page=1000,
        )
    )


def engine_read(partition: Partition) -> list[Any]:
    events: list[Any] = []
    start = 1
    while True:
        page = Stream.read(partition, start_version=start, slice_size=1000)
        events += page.events
        if page.is_end_of_stream:
            return events
        start = page.events[-1].version + 1


def measure_async(
    connection_string: str, table: TableClient, streams: int, per_stream: int, repeats: int
) -> None:
    """Many streams in flight with the async client, beside the sync client one by one."""
    events = _events(per_stream)
    loop = asyncio.new_event_loop()
    aclient = AsyncTableClient.from_connection_string(connection_string, table.table_name)

    def keys(prefix: str) -> list[str]:
        return [f"{prefix}-{uuid.uuid4().hex}" for _ in range(streams)]

    async def write_all(partitions: list[Partition]) -> None:
        await asyncio.gather(
            *(aio.Stream.write(p, *events, expected_version=0) for p in partitions)
        )

    written: list[str] = []

    def run_async(_: int) -> float:
        partitions = [Partition(aclient, k) for k in keys("a")]
        written.extend(p.partition_key for p in partitions)
        return timed(lambda: loop.run_until_complete(write_all(partitions)))

    def run_sync(_: int) -> float:
        partitions = [Partition(table, k) for k in keys("s")]
        written.extend(p.partition_key for p in partitions)

        def write_each() -> None:
            for p in partitions:
                Stream.write(p, *events, expected_version=0)

        return timed(write_each)

    log(f"async: {streams} streams x {per_stream} events x {repeats} repeats, async beside sync")
    run_async(0), run_sync(0)
    values, peers = paired(run_async, run_sync, repeats)
    for pk in written:
        stored = Stream.read(Partition(table, pk))
        check(
            stored.stream.version == per_stream, f"stream {pk} holds {stored.stream.version} events"
        )
    emit(
        "stream.write.async", "ms", "lower", [v * 1000 for v in values],
        "sync client, streams one after another", [p * 1000 for p in peers],
        {"streams": streams, "events_per_stream": per_stream},
    )  # fmt: skip
    loop.run_until_complete(aclient.close())
    loop.close()


def main() -> int:
    is_quick = quick(__doc__)
    write_n, read_n, repeats = (500, 2_000, 3) if is_quick else (2_000, 10_000, 7)
    streams, per_stream = (50, 5) if is_quick else (50, 10)
    # A read takes about a second and both sides share two cores with
    # Azurite: more pairs keep the median's ratio steady.
    read_repeats = repeats if is_quick else 15

    with account() as connection_string:
        service = TableServiceClient.from_connection_string(connection_string)
        table = service.create_table_if_not_exists("benchstream" + uuid.uuid4().hex[:8])
        events = _events(write_n)
        written: list[tuple[str, str]] = []

        def engine(_: int) -> float:
            partition = Partition(table, "e-" + uuid.uuid4().hex)
            written.append(("engine", partition.partition_key))
            return timed(lambda: Stream.write(Stream(partition), *events))

        def raw(_: int) -> float:
            pk = "r-" + uuid.uuid4().hex
            written.append(("raw", pk))
            return timed(lambda: raw_write(table, pk, events))

        log(f"write: {write_n} events x {repeats} repeats, engine beside raw")
        engine(0), raw(0)  # warm up connections and code paths
        values, peers = paired(engine, raw, repeats)
        for side, pk in written:
            stored = list(
                table.query_entities(
                    "PartitionKey eq @pk", parameters={"pk": pk}, select=["RowKey"]
                )
            )
            check(len(stored) == 1 + 2 * write_n, f"{side} write of {pk} stored {len(stored)} rows")
        emit(
            "stream.write", "ms", "lower", [v * 1000 for v in values],
            "raw azure-data-tables transactions", [p * 1000 for p in peers],
            {"events": write_n, "rows": 1 + 2 * write_n},
        )  # fmt: skip

        log(f"read: {read_n} events x {read_repeats} repeats, engine beside raw")
        partition = Partition(table, "read-" + uuid.uuid4().hex)
        Stream.write(Stream(partition), *_events(read_n))
        engine_events = engine_read(partition)
        raw_events = raw_read(table, partition.partition_key, read_n)
        check([e.version for e in engine_events] == list(range(1, read_n + 1)), "engine read order")
        check(len(raw_events) == read_n, f"raw read returned {len(raw_events)} rows")
        values, peers = paired(
            lambda _: timed(lambda: engine_read(partition)),
            lambda _: timed(lambda: raw_read(table, partition.partition_key, read_n)),
            read_repeats,
        )
        emit(
            "stream.read", "ms", "lower", [v * 1000 for v in values],
            "raw azure-data-tables range query", [p * 1000 for p in peers],
            {"events": read_n, "slice_size": 1000},
        )  # fmt: skip
        measure_async(connection_string, table, streams, per_stream, repeats)
        service.delete_table(table.table_name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
