"""Where a Spark task's time goes: cProfile over the task body, grouped by package.

The body is ``spark_driver``'s ``process_partition``, what every task of the
pipeline runs (rows of one partition, grouped by key, into
``Processor.process_batch``), called here in one process on the same kind of
input as ``bench_spark.py`` so that the profile sees only the task, not
Spark's scheduling, with one key at a time (``concurrency=1``) so that the
profile sees every call. It prints one JSON line per cost group (its share of
the task's time), the largest first, then the top functions.

Run: ``python benchmarks/profile_task.py [--quick]``.
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import random
import sys
import sysconfig
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from _common import account, check, emit, log, quick
from azure.data.tables import TableServiceClient

from spark_driver import JobSettings
from spark_driver._tasks._executor import process_partition


def rows(games: int, per_game: int) -> list[dict[str, Any]]:
    rng = random.Random(7)
    out = []
    for g in range(games):
        key = f"game-{g:05d}"
        start = {"message_id": f"{key}-round", "key": key, "type": "StartNewRound", "body": None}
        out.append(start)
        out += [
            {"message_id": f"{key}-shot-{n}", "key": key, "type": "FireAt",
             "body": json.dumps({"position": rng.randrange(100)})}
            for n in range(1, per_game)
        ]  # fmt: skip
    return out  # grouped by key and in order, as the job hands them to a task


SITE = f"{os.sep}site-packages{os.sep}"
ROOT = str(Path(__file__).resolve().parents[1])
STDLIB = sysconfig.get_paths()["stdlib"] + os.sep


def group(filename: str, function: str) -> str:
    """The package a function belongs to, or what a builtin does."""
    if filename == "~":
        if "socket" in function or "ssl" in function or "select" in function:
            return "socket I/O (waiting for Azurite)"
        if "_thread.lock" in function:
            return "waiting on the parallel-read threads"
        return "builtins"
    if f"{os.sep}email{os.sep}" in filename:
        return "stdlib email (parsing multipart $batch responses)"
    if f"{os.sep}http{os.sep}" in filename:
        return "stdlib http.client"
    if SITE in filename:
        return filename.split(SITE, 1)[1].split(os.sep)[0]
    if filename.startswith(ROOT):
        return filename[len(ROOT) + 1 :].split(os.sep)[0]
    return "stdlib " + Path(filename).stem


def profile(table: str, work: list[dict[str, Any]]) -> tuple[pstats.Stats, float, Counter[str]]:
    # One key at a time: cProfile sees only the thread that enabled it, and
    # with keys in flight the task's own thread would only wait on the others.
    settings = JobSettings(table=table, handler="shooting_range", concurrency=1)
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    result_rows = list(process_partition(iter(work), settings))
    profiler.disable()
    elapsed = time.perf_counter() - start
    statuses = Counter(row[4] for row in result_rows if row[0] == "outcome")
    check(sum(statuses.values()) == len(work), f"task saw {sum(statuses.values())}")
    check(statuses["completed"] == len(work), f"task outcomes {dict(statuses)}")
    log(f"task: {len(work)} rows, {len(result_rows)} result rows in {elapsed:.2f} s")
    return pstats.Stats(profiler), elapsed, statuses


def main() -> int:
    is_quick = quick(__doc__)
    games, per_game = (50, 20) if is_quick else (250, 40)
    with account() as connection_string:
        os.environ["STREAMSTONE_CONNECTION_STRING"] = connection_string
        table = f"profile{uuid.uuid4().hex[:10]}"
        TableServiceClient.from_connection_string(connection_string).create_table(table)
        work = rows(games, per_game)
        stats, elapsed, _ = profile(table, work)
    total = sum(tottime for (_, _, tottime, _, _) in stats.stats.values())  # type: ignore[attr-defined]
    groups: Counter[str] = Counter()
    functions: Counter[str] = Counter()
    for (filename, line, function), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        groups[group(filename, function)] += tottime
        where = (
            filename.split(SITE, 1)[-1] if SITE in filename else filename.replace(ROOT + os.sep, "")
        )
        if where.startswith(STDLIB):  # no machine paths in the report
            where = "stdlib " + where[len(STDLIB) :]
        functions[f"{where}:{line}({function})"] += tottime
    params = {"rows": len(work), "keys": games, "task_seconds": round(elapsed, 3)}
    for rank, (name, seconds) in enumerate(groups.most_common(8), start=1):
        emit(f"profile.task.group.{rank}", "share of task time", "lower", [seconds / total],
             None, None, {**params, "group": name, "seconds": round(seconds, 3)})  # fmt: skip
    for rank, (name, seconds) in enumerate(functions.most_common(10), start=1):
        emit(f"profile.task.function.{rank}", "share of task time", "lower", [seconds / total],
             None, None, {**params, "function": name, "seconds": round(seconds, 3)})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
