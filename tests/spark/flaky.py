"""Handlers that fail the way Spark tasks fail, for the pipeline tests.

The exceptions derive from BaseException, so the handlers runtime cannot turn
them into an outcome: they fail the Spark task, as a lost executor would.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from pyspark import TaskContext

from handlers import HandlerContext, Message, handler
from handlers.examples import ShootingRange, shooting_range


class TaskDied(BaseException):
    """The task's Python worker died here."""


#: The keys each task attempt has handled so far, in this Python worker.
_keys_seen: dict[tuple[int, int, int], set[str]] = {}


@handler("ShootingRange", ShootingRange, types=["StartNewRound", "FireAt"])
def first_attempt_dies(state: ShootingRange, message: Message, ctx: HandlerContext) -> Any:
    """Dies in the first attempt of every task, in its second key: the first key's
    versions (and outbox rows) are stored by then, and the attempt's rows are lost."""
    task = TaskContext.get()
    if task is not None and task.attemptNumber() == 0:
        seen = _keys_seen.setdefault((task.stageId(), task.partitionId(), 0), set())
        seen.add(message.key)
        if len(seen) >= 2 and message.id.endswith("-shot-5"):
            raise TaskDied(f"attempt 0 of task {task.partitionId()} dies at {message.id}")
    return shooting_range.handle(state, message, ctx)


def die_marker(message_id: str) -> Path:
    """While this file exists, every attempt dies at ``message_id`` (workers share the disk)."""
    return Path(tempfile.gettempdir()) / f"streamstone-test-die-at-{message_id}"


@handler("ShootingRange", ShootingRange, types=["StartNewRound", "FireAt"])
def job_dies(state: ShootingRange, message: Message, ctx: HandlerContext) -> Any:
    """Dies in every attempt once it reaches the marked message: the whole job fails."""
    if die_marker(message.id).exists():
        raise TaskDied(f"the job dies at {message.id}")
    return shooting_range.handle(state, message, ctx)


@handler("ShootingRange", ShootingRange, types=["StartNewRound", "FireAt"])
def refuses_far_shots(state: ShootingRange, message: Message, ctx: HandlerContext) -> Any:
    """An ordinary handler error: position 99 is refused."""
    if (message.body or {}).get("position") == 99:
        raise ValueError("position 99 is out of range")
    return shooting_range.handle(state, message, ctx)
