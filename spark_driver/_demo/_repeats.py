"""What Spark repeats, made to happen in the demo (``make demo``) on one machine.

A retried task: :data:`dies_once` is the ShootingRange handler with a fault
that kills the first attempt of one task in its Python worker when that
attempt begins its :data:`DIE_AT`-th game, after the games before were
written; Spark then runs the task again. The fault acts only while the demo
has armed it (:func:`armed` names the demo's own folder in the environment
the local workers inherit) and only once (a file in that folder records the
death), so a job that names this handler outside the demo runs the plain
handler.

Speculative copies: Spark checks for slow tasks only under a cluster manager
(never in local mode), and starts a copy only on a host where the task has
no attempt yet, so one machine never runs one. :func:`speculative_copies`
runs what a copy is instead: the job's task body twice at once, on two
Python workers, over the same rows.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark import TaskContext
from pyspark.sql import SparkSession

from handlers import HandlerContext, Message, handler
from handlers.examples import ShootingRange, shooting_range

from .._settings import JobSettings
from .._tasks._executor import RESULT_SCHEMA, process_partition

__all__ = [
    "DIE_AT", "FAILING_TASK", "armed", "death", "dies_once", "failed_attempts",
    "speculative_copies",
]  # fmt: skip

#: The task (partition) whose first attempt dies, and at which of its games.
FAILING_TASK = 3
DIE_AT = 32
_ARMED = "STREAMSTONE_DEMO_FAULT_FOLDER"
_DIED = "died.json"


class TaskDied(BaseException):
    """The demo's fault: a BaseException, which the handlers runtime does not
    turn into an outcome, so it fails the Spark task as a lost worker would."""


_lock = threading.Lock()
#: The games each task attempt has begun, in this Python worker (keys run on threads).
_begun: dict[int, list[str]] = {}


@handler("ShootingRange", ShootingRange, types=["StartNewRound", "FireAt"])
def dies_once(state: ShootingRange, message: Message, ctx: HandlerContext) -> Any:
    """``shooting_range``, but for the demo's fault (see the module's text)."""
    folder = os.environ.get(_ARMED)
    task = TaskContext.get()
    if folder and task and task.partitionId() == FAILING_TASK and task.attemptNumber() == 0:
        with _lock:
            begun = _begun.setdefault(task.taskAttemptId(), [])
            first = message.key not in begun
            if first:
                begun.append(message.key)
            dies = first and len(begun) == DIE_AT
        if dies:
            _die(Path(folder), message, task)
    return shooting_range.handle(state, message, ctx)


def _die(folder: Path, message: Message, task: TaskContext) -> None:
    record = {"task": task.partitionId(), "attempt": task.attemptNumber(), "key": message.key}
    try:
        with (folder / _DIED).open("x") as out:  # exclusive: the fault acts once
            json.dump(record, out)
    except FileExistsError:
        return
    raise TaskDied(f"the demo's fault: attempt 0 of task {FAILING_TASK} dies at {message.key}")


@contextlib.contextmanager
def armed(folder: Path) -> Iterator[None]:
    """The fault armed for Python workers started inside the block (local mode:
    they inherit the driver's environment when its JVM starts)."""
    os.environ[_ARMED] = str(folder)
    try:
        yield
    finally:
        del os.environ[_ARMED]


def death(folder: Path) -> dict[str, Any] | None:
    """What the fault recorded when it killed a task attempt; None if it never did."""
    path = folder / _DIED
    return json.loads(path.read_text()) if path.exists() else None


def failed_attempts(spark: SparkSession) -> int:
    """Task attempts that failed in the session's jobs so far, by Spark's own count."""
    tracker = spark.sparkContext.statusTracker()
    failed = 0
    for job in tracker.getJobIdsForGroup():
        info = tracker.getJobInfo(job)
        for stage in info.stageIds if info else ():
            stage_info = tracker.getStageInfo(stage)
            failed += stage_info.numFailedTasks if stage_info else 0
    return failed


def speculative_copies(
    spark: SparkSession, rows: list[dict[str, Any]], settings: JobSettings
) -> list[list[dict[str, Any]]]:
    """The job's task body over ``rows``, twice at once (two tasks on the two
    cores, two Python workers): each copy's result rows, as dicts."""
    ordered = sorted(rows, key=lambda row: row["key"])  # stable: the input order within a key
    names = RESULT_SCHEMA.fieldNames()
    job = settings

    def run(index: int, part: Any) -> Iterator[tuple[int, dict[str, Any]]]:
        for copy in part:
            for row in process_partition(copy, job):
                yield index, dict(zip(names, row, strict=True))

    results = spark.sparkContext.parallelize([ordered, ordered], 2)
    copies: list[list[dict[str, Any]]] = [[], []]
    for index, row in results.mapPartitionsWithIndex(run).collect():
        copies[index].append(row)
    return copies
