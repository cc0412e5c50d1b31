"""The demo: a ShootingRange workload through the Spark pipeline, with what
Spark repeats.

It writes 20,000 messages over 500 games (a StartNewRound and 39 FireAt per
game), adds 20% duplicates, shuffles them, and moves a quarter of the
duplicates to the end of the input (late redeliveries). The batch job runs on
local Spark with speculation on, while the first attempt of one task dies
partway in its Python worker and Spark retries it; then again over the same
input; then the job's task body runs twice at once over 25 games, as a
speculative copy would (see ``_demo._repeats``). The check compares the stored
states and the outputs with a clean run's (``_demo._reference``): every
distinct message changed state exactly once, the rerun changed nothing, and
every run produced the same output messages.
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from azure.data.tables import TableServiceClient
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from streamstone_py import TableConfig

from ._demo._reference import clean_run, output_rows, read_rows, stored_states
from ._demo._repeats import (
    DIE_AT,
    FAILING_TASK,
    armed,
    death,
    failed_attempts,
    speculative_copies,
)
from ._job import run_batch
from ._session import session
from ._settings import JobSettings

GAMES = 500
PER_GAME = 40
DUPLICATE_SHARE = 0.2
SEED = 20261121
#: Two cores, and a failed task is tried up to four times (``local[2]`` tries once).
MASTER = "local[2,4]"
#: The games the speculative copies run over.
COPIED_GAMES = 25
#: shooting_range with the demo's fault (see ``_demo._repeats``).
_DYING = "spark_driver._demo._repeats:dies_once"


def workload(path: Path, games: int = GAMES, per_game: int = PER_GAME) -> tuple[int, int]:
    """Write the input as JSON lines; return (distinct messages, rows)."""
    rng = random.Random(SEED)
    messages = []
    for g in range(games):
        game = f"game-{g:04d}"
        messages.append(
            {"message_id": f"{game}-round-1", "key": game, "type": "StartNewRound", "body": None}
        )
        for n in range(1, per_game):
            body = json.dumps(
                {"position": rng.randrange(100), "player": f"player-{rng.randrange(20)}"}
            )
            messages.append(
                {"message_id": f"{game}-shot-{n}", "key": game, "type": "FireAt", "body": body}
            )
    duplicates = rng.sample(messages, int(len(messages) * DUPLICATE_SHARE))
    late = duplicates[: len(duplicates) // 4]
    rows = messages + duplicates[len(duplicates) // 4 :]
    rng.shuffle(rows)
    rows += late
    with path.open("w") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    return len(messages), len(rows)


def main(strategy: str = "state") -> int:
    """Run the demo with the state-based (default) or the outbox strategy; 0 if it passes."""
    if strategy not in ("state", "outbox"):
        print(f"strategy must be 'state' or 'outbox', got {strategy!r}", file=sys.stderr)
        return 2
    if not os.environ.get("STREAMSTONE_CONNECTION_STRING"):
        print(
            "set STREAMSTONE_CONNECTION_STRING (make demo starts Azurite and does)", file=sys.stderr
        )
        return 2
    base = "shootingrange" if strategy == "state" else "shootingrangeoutbox"
    service = TableServiceClient.from_connection_string(os.environ["STREAMSTONE_CONNECTION_STRING"])
    tables = {p: service.create_table_if_not_exists(base + p) for p in ("", "clean", "copies")}
    job = JobSettings(table=base, handler=_DYING, strategy=strategy)  # type: ignore[arg-type]
    copies_job = replace(job, table=base + "copies", handler="shooting_range")
    with tempfile.TemporaryDirectory(prefix="streamstone-demo-") as work, armed(Path(work)):
        root = Path(work)
        distinct, rows = workload(root / "messages.jsonl")
        feed = read_rows(root / "messages.jsonl")
        print(f"strategy: {strategy}")
        print(f"workload: {rows:,} rows, {distinct:,} distinct messages over {GAMES} games "
              f"({rows - distinct:,} duplicates, a quarter of them at the end)")  # fmt: skip
        print(f"spark: {MASTER} (two cores, a failed task tried up to four times), "
              "spark.speculation=true")  # fmt: skip
        print(f"fault: the first attempt of task {FAILING_TASK} (of 8) dies in its Python worker "
              f"as it begins its game number {DIE_AT}")  # fmt: skip
        spark = session(MASTER, "streamstone-py demo", **{"spark.speculation": "true"})
        try:
            summaries = []
            for run in (1, 2):
                started = time.perf_counter()
                summary = run_batch(
                    spark, str(root / "messages.jsonl"), str(root / f"run{run}"), job
                )
                seconds = time.perf_counter() - started
                title = "run 1" if run == 1 else "run 2, the rerun over the same input"
                print(f"\n{title}: {seconds:.1f} s, {rows / seconds:,.0f} messages/s\n"
                      f"{summary.table()}")  # fmt: skip
                if run == 1:
                    retry = _retried_task(spark, root, summary.duplicates, rows - distinct)
                    print(f"\n{retry.note}")
                summaries.append(summary)
            produced = [
                output_rows(r.asDict() for r in spark.read.parquet(str(root / run)).collect())
                for run in ("run1/outputs", "run2/outputs")
            ]
            copied_keys = {f"game-{g:04d}" for g in range(COPIED_GAMES)}
            copied_rows = [row for row in feed if row["key"] in copied_keys]
            copies = speculative_copies(spark, copied_rows, copies_job)
        finally:
            spark.stop()
    started = time.perf_counter()
    # The job's runner, the wire one, writes fastest; the states are read back with the SDK.
    writer = TableConfig.from_env(table_name=base + "clean", transport="wire").table_client()
    reference = clean_run(feed, writer, strategy)
    clean_seconds = time.perf_counter() - started
    games = [f"game-{g:04d}" for g in range(GAMES)]
    states = {part: stored_states(tables[part], games, strategy) for part in ("", "clean")}
    copied = _Copies.of(
        copies, copied_rows, reference,
        stored_states(tables["copies"], sorted(copied_keys), strategy),
        {key: states["clean"][key] for key in sorted(copied_keys)},
    )  # fmt: skip
    print(f"\n{_requests_note(strategy, summaries[0].requests, summaries[1].requests)}")
    print(f"\n{copied.note}")
    print(f"\nclean run, the reference: the handlers runtime alone, without Spark, each "
          "distinct message once, each game's in the order the job applies them, into a "
          f"table of its own: {clean_seconds:.1f} s.")  # fmt: skip
    first, second = summaries
    versions = sum(version for version, _ in states[""].values())
    checks = [
        ("the duplicated, shuffled feed: every copy was a duplicate, not a change (run 1)",
         first.processed == distinct - retry.written
         and first.processed + first.duplicates == rows),
        (f"the retried task: its first attempt's {retry.written:,} messages were found stored, "
         "not applied again", retry.ok),
        ("every distinct message changed state once: stored versions = distinct messages",
         versions == distinct),
        (f"stored states = the clean run's ({GAMES} games)", states[""] == states["clean"]),
        (f"outputs = the clean run's, one per FireAt ({len(reference):,})",
         produced[0] == reference and len(reference) == GAMES * (PER_GAME - 1)),
        ("the rerun changed no state and wrote the same outputs again, none new",
         (second.processed, second.duplicates, second.new_outputs) == (0, rows, 0)
         and produced[1] == produced[0]),
        ("speculative copies: states and outputs = the clean run's, each copy emitted all",
         copied.ok),
        ("nothing dead-lettered, abandoned or in doubt",
         all(s.dead_lettered == s.abandoned == s.faulted == 0 for s in summaries)),
    ]  # fmt: skip
    print("\nexactly-once check:")
    for label, ok in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {label}")
    print(f"  ({versions:,} stored versions, {len(produced[0]):,} outputs)")
    return 0 if all(ok for _, ok in checks) else 1


@dataclass(frozen=True)
class _Retry:
    written: int
    ok: bool
    note: str


def _retried_task(spark: SparkSession, root: Path, duplicates: int, in_feed: int) -> _Retry:
    """What the fault did in run 1, by its own record, Spark's count of failed
    attempts, and run 1's outcomes: the games the dead attempt had written
    are those with no message completed (the retry found them all stored)."""
    died, failed = death(root), failed_attempts(spark)
    outcomes = spark.read.parquet(str(root / "run1" / "outcomes"))
    per_game = outcomes.groupBy("key").agg(
        F.sum((F.col("status") == "completed").cast("int")).alias("completed"),
        F.countDistinct("message_id").alias("messages"),
    )
    games = {r["key"]: r["messages"] for r in per_game.where("completed = 0").collect()}
    written = sum(games.values())
    if died is None:
        return _Retry(0, False, f"the retried task: the fault never acted ({failed} failed)")
    ok = failed == 1 and written > 0 and died["key"] not in games
    return _Retry(written, ok and duplicates == in_feed + written, (
        f"the retried task: attempt 0 of task {died['task']} died at {died['key']} (the "
        f"task's game number {DIE_AT}) after writing {written:,} messages of {len(games)} "
        f"games; Spark counted {failed} failed task attempt and ran the task again: its "
        f"attempt 1 found those {written:,} messages stored and reported them as "
        f"duplicates, not changes (run 1's {duplicates:,} duplicates = {in_feed:,} copies "
        f"in the feed + {written:,})."
    ))  # fmt: skip


@dataclass(frozen=True)
class _Copies:
    ok: bool
    note: str

    @classmethod
    def of(cls, copies: list[list[dict[str, Any]]], rows: list[dict[str, Any]],
           reference: list[tuple[Any, ...]], states: dict[str, Any],
           clean: dict[str, Any]) -> _Copies:  # fmt: skip
        """The two copies' result rows against the clean run, on their games."""
        distinct = len({row["message_id"] for row in rows})
        outcomes = [r for copy in copies for r in copy if r["kind"] == "outcome"]
        statuses = [r["status"] for r in outcomes]
        completed, duplicates = statuses.count("completed"), statuses.count("duplicate")
        expected = [o for o in reference if o[5] in states]  # by source key
        emitted = [sorted(set(output_rows(r for r in c if r["kind"] == "output"))) for c in copies]
        ok = (
            (completed, duplicates) == (distinct, 2 * len(rows) - distinct)
            and all(outputs == expected for outputs in emitted)
            and states == clean
        )
        return cls(ok, (
            "speculative copies: spark.speculation is on, but Spark looks for slow tasks "
            "only under a cluster manager, never in local mode, and starts a copy only on "
            "a host where the task has no attempt: one machine never runs one. The demo "
            "runs what a copy is instead: the job's task body twice at once, on two Python "
            f"workers, over the same {len(rows):,} rows ({len(states)} games, {distinct:,} "
            f"distinct messages) into a table of its own. {completed:,} messages changed "
            f"state (each in one copy or the other), {duplicates:,} were duplicates, "
            f"{sum(r['conflicts'] for r in outcomes)} conflicts between the copies were "
            f"retried, and each copy emitted all {len(expected):,} outputs."
        ))  # fmt: skip


def _requests_note(strategy: str, first: int, second: int) -> str:
    """Why the rerun sends more storage requests than the first run."""
    why = (
        "reads its header, sends the write, which the table refuses because the first "
        "message is stored, reads that message's id row, reads the stored versions in one "
        "range to handle the duplicates again on the states before them, and reads the "
        "header again"
    )
    if strategy == "outbox":
        why = (
            "reads its header, sends the write, which the table refuses, and reads each "
            "duplicate's outbox entry (one request per message) to emit its stored outputs "
            "again"
        )
    return (
        f"storage requests: run 1 {first:,} ({first / GAMES:.1f} per game), run 2 {second:,} "
        f"({second / GAMES:.1f} per game). Run 2 finds every message stored: for each game "
        f"it {why}."
    )


if __name__ == "__main__":
    sys.exit(main())
