"""A Spark task's peak memory as its keys grow: the header cache bounded,
nothing kept per key.

The task body (``process_partition``, as ``profile_task.py`` runs it: the
job's defaults, its header cache on, 8 keys in flight) over one message on
each of 100,000 keys, beside the same over 1,000 keys (10,000 and 100 with
``--quick``). Each runs in a fresh Python process, as a Spark Python worker
does, its rows handed over as a stream (not a list: Spark streams a
partition's rows to the worker) and its result rows counted, not kept.

- ``task.memory.peak``: the worker's peak resident memory (``ru_maxrss``),
  beside the same at the smaller size (target: at most 1.5x);
- ``task.memory.growth``: the peak above the worker's resident memory just
  before the task (imports done, a few keys processed), beside the same.

Run: ``python benchmarks/bench_task_memory.py [--quick]``.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import account, check, emit, log, quick
from azure.data.tables import TableServiceClient

REPEATS = 1


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def rows(keys: int, prefix: str) -> Iterator[dict[str, Any]]:
    for g in range(keys):
        key = f"{prefix}-{g:06d}"
        yield {"message_id": f"{key}-round", "key": key, "type": "StartNewRound", "body": None}


def child(keys: int, table: str) -> None:
    """The task in this process; prints its figures as one JSON line."""
    from spark_driver import JobSettings
    from spark_driver._tasks._executor import process_partition

    settings = JobSettings(table=table, handler="shooting_range")

    def run(work: Iterator[dict[str, Any]]) -> Counter[str]:
        return Counter(row[4] for row in process_partition(work, settings) if row[0] == "outcome")

    run(rows(20, "warm"))
    before = rss_kib()
    statuses = run(rows(keys, "game"))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(json.dumps({"before": before, "peak": peak, "statuses": dict(statuses)}))


def measure(keys: int, table: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(keys), table],
        capture_output=True, text=True, check=False, env=os.environ.copy(),
    )  # fmt: skip
    check(done.returncode == 0, f"the task over {keys} keys failed: {done.stderr[-2000:]}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    check(figures["statuses"] == {"completed": keys}, f"{keys} keys: {figures['statuses']}")
    log(f"{keys:,} keys: peak {figures['peak'] / 1024:.1f} MiB, "
        f"{figures['before'] / 1024:.1f} MiB before the task")  # fmt: skip
    return figures


def main() -> int:
    small, large = (100, 10_000) if quick(__doc__) else (1_000, 100_000)
    with account() as connection_string:
        os.environ["STREAMSTONE_CONNECTION_STRING"] = connection_string
        tables = TableServiceClient.from_connection_string(connection_string)
        sides: dict[int, list[dict[str, Any]]] = {small: [], large: []}
        for _ in range(REPEATS):
            for keys in (small, large):
                table = f"memory{uuid.uuid4().hex[:10]}"
                tables.create_table(table)
                sides[keys].append(measure(keys, table))
                tables.delete_table(table)
    params = {"keys": large, "messages_per_key": 1, "peer_keys": small, "header_cache": True}
    peer = f"the same task over {small:,} keys x 1"
    emit("task.memory.peak", "MiB", "lower", [f["peak"] / 1024 for f in sides[large]], peer,
         [f["peak"] / 1024 for f in sides[small]], params)  # fmt: skip
    emit("task.memory.growth", "MiB", "lower",
         [(f["peak"] - f["before"]) / 1024 for f in sides[large]], peer,
         [(f["peak"] - f["before"]) / 1024 for f in sides[small]], params)  # fmt: skip
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(int(sys.argv[2]), sys.argv[3])
    else:
        raise SystemExit(main())
