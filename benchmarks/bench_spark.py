"""The Spark pipeline beside what a Spark user would reach for, and beside the ceiling.

On the same ShootingRange input (messages over games, 20% duplicated):

- ``spark.pipeline``: this project's batch job on ``local[2]`` (exactly-once
  state in Azure Table Storage), in messages per second;
- peer ``spark.state``: Spark's own per-key state, ``dropDuplicates`` on the
  message id then ``applyInPandasWithState`` over the same input as a stream
  (state in Spark's checkpoint, not in a table);
- ceiling ``azurite.batch_insert``: raw azure-data-tables batch inserts of one
  row per message, 100 to a transaction, from one thread;
- ``spark.scaling.cores``: the pipeline on ``local[2]`` beside ``local[1]``
  (a second session, after the first is stopped).

Run: ``python benchmarks/bench_spark.py [--quick]``.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import account, check, emit, quick
from azure.data.tables import TableServiceClient

from spark_driver import JobSettings, run_batch, session


def workload(path: Path, games: int, per_game: int) -> tuple[int, int]:
    rng = random.Random(7)
    rows = []
    for g in range(games):
        key = f"game-{g:05d}"
        rows.append(
            {
                "message_id": f"{key}-round",
                "key": key,
                "type": "StartNewRound",
                "body": None,
                "seq": 0,
            }
        )
        for n in range(1, per_game):
            body = json.dumps({"position": rng.randrange(100)})
            rows.append(
                {
                    "message_id": f"{key}-shot-{n}",
                    "key": key,
                    "type": "FireAt",
                    "body": body,
                    "seq": n,
                }
            )
    distinct = len(rows)
    rows += rng.sample(rows, distinct // 5)
    rng.shuffle(rows)
    path.mkdir(parents=True, exist_ok=True)
    with (path / "messages.jsonl").open("w") as out:
        out.writelines(json.dumps(r) + "\n" for r in rows)
    return distinct, len(rows)


def spark_state(spark: Any, inbox: Path, checkpoint: Path) -> int:
    """ShootingRange with Spark's own state: dedup, then applyInPandasWithState."""
    import pandas as pd
    from pyspark.sql.streaming.state import GroupStateTimeout
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    schema = StructType([
        StructField("message_id", StringType()), StructField("key", StringType()),
        StructField("type", StringType()), StructField("body", StringType()),
        StructField("seq", LongType()),
    ])  # fmt: skip
    out_schema = "message_id string, key string, type string"
    state_schema = StructType(
        [StructField(n, IntegerType()) for n in ("target", "attempts", "rounds")]
    )

    def shoot(
        key: tuple[str], frames: Iterator[pd.DataFrame], state: Any
    ) -> Iterator[pd.DataFrame]:
        target, attempts, rounds = state.get if state.exists else (0, 0, 0)
        outputs = []
        for frame in frames:
            for row in frame.sort_values("seq").itertuples():
                rng = random.Random(row.message_id)
                if row.type == "StartNewRound":
                    rounds, attempts, target = rounds + 1, 0, rng.randrange(100)
                    continue
                hit = json.loads(row.body)["position"] == target
                outputs.append((f"{row.message_id}-out", key[0], "Hit" if hit else "Missed"))
                attempts, target = (
                    (0, rng.randrange(100)) if attempts + 1 >= 3 else (attempts + 1, target)
                )
        state.update((target, attempts, rounds))
        yield pd.DataFrame(outputs, columns=["message_id", "key", "type"])

    results: list[int] = []

    def collect(batch: Any, batch_id: int) -> None:
        results.append(batch.count())

    query = (
        spark.readStream.schema(schema).json(str(inbox))
        .dropDuplicates(["message_id"])
        .groupBy("key")
        .applyInPandasWithState(
            shoot, out_schema, state_schema, "append", GroupStateTimeout.NoTimeout
        )
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )  # fmt: skip
    query.awaitTermination()
    return sum(results)


def raw_inserts(connection_string: str, inbox: Path) -> int:
    """The ceiling: one row per message, batched by key, 100 to a transaction."""
    service = TableServiceClient.from_connection_string(connection_string)
    table = service.create_table_if_not_exists("raw" + uuid.uuid4().hex[:10])
    by_key: dict[str, dict[str, dict[str, Any]]] = {}
    with (inbox / "messages.jsonl").open() as lines:
        for line in lines:
            row = json.loads(line)
            by_key.setdefault(row["key"], {})[row["message_id"]] = row
    written = 0
    for key, messages in by_key.items():
        entities = [{"PartitionKey": key, "RowKey": m, "Type": r["type"], "Body": r["body"] or ""}
                    for m, r in messages.items()]  # fmt: skip
        for start in range(0, len(entities), 100):
            chunk = entities[start : start + 100]
            table.submit_transaction([("create", e) for e in chunk])
            written += len(chunk)
    return written


def main() -> int:
    is_quick = quick(__doc__)
    games, per_game, repeats = (100, 20, 2) if is_quick else (500, 40, 3)
    with account() as connection_string, tempfile.TemporaryDirectory() as work:
        os.environ["STREAMSTONE_CONNECTION_STRING"] = connection_string
        root = Path(work)
        distinct, rows = workload(root / "inbox", games, per_game)
        spark = session("local[2]", "bench", **{"spark.ui.showConsoleProgress": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        ours, theirs, ceiling, one_core = [], [], [], []

        def pipeline(n: int) -> float:
            table = f"bench{uuid.uuid4().hex[:10]}"
            TableServiceClient.from_connection_string(connection_string).create_table(table)
            start = time.perf_counter()
            settings = JobSettings(table=table, handler="shooting_range")
            summary = run_batch(
                spark, str(root / "inbox"), str(root / f"out{uuid.uuid4().hex}"), settings,
                partitions=4,
            )  # fmt: skip
            rate = rows / (time.perf_counter() - start)
            check(summary.processed == distinct and summary.duplicates == rows - distinct,
                  f"pipeline processed {summary.processed} of {distinct}")  # fmt: skip
            return rate

        try:
            for n in range(repeats):
                ours.append(pipeline(n))
                start = time.perf_counter()
                produced = spark_state(spark, root / "inbox", root / f"checkpoint{n}")
                theirs.append(rows / (time.perf_counter() - start))
                check(produced == distinct - games, f"Spark state produced {produced} outputs")
                start = time.perf_counter()
                written = raw_inserts(connection_string, root / "inbox")
                ceiling.append(written / (time.perf_counter() - start))
                check(written == distinct, f"raw inserts wrote {written} rows")
            spark.stop()
            spark = session("local[1]", "bench", **{"spark.ui.showConsoleProgress": "false"})
            spark.sparkContext.setLogLevel("ERROR")
            one_core = [pipeline(n) for n in range(repeats)]
        finally:
            spark.stop()
    params = {"messages": rows, "distinct": distinct, "games": games, "master": "local[2]"}
    emit(
        "spark.pipeline",
        "messages/s",
        "higher",
        ours,
        "Spark per-key state + dropDuplicates",
        theirs,
        params,
    )
    emit(
        "spark.pipeline.vs_ceiling",
        "messages/s",
        "higher",
        ours,
        "raw batch inserts into Azurite",
        ceiling,
        params,
    )
    emit(
        "spark.scaling.cores", "messages/s", "higher", ours, "the pipeline on local[1]", one_core,
        {**params, "peer_master": "local[1]"},
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
