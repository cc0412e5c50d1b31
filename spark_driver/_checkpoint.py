"""What a file stream's checkpoint tells the driver: the micro-batches Spark
planned and committed, the files its file source took in each (with their
modification times then), and the records the job keeps beside Spark's."""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql import SparkSession

from ._checks import INPUT_RECORD
from ._files import canonical, names, read_text, write_text

__all__ = ["Checkpoint"]


class Checkpoint:
    """The checkpoint directory ``path`` of a stream with one file source."""

    def __init__(self, spark: SparkSession, path: str) -> None:
        self.spark, self.path = spark, path.rstrip("/")

    def _batches(self, log: str) -> list[int]:
        return sorted(int(n) for n in names(self.spark, f"{self.path}/{log}") if n.isdigit())

    def uncommitted(self) -> int | None:
        """The micro-batch Spark planned last and never committed, if any."""
        planned = self._batches("offsets")
        if not planned or planned[-1] in self._batches("commits"):
            return None
        return planned[-1]

    def last_committed(self) -> int | None:
        done = self._batches("commits")
        return done[-1] if done else None

    def taken_in(self, batch_id: int) -> list[tuple[str, int]]:
        """The files Spark's file source put in micro-batch ``batch_id``, each
        as ``(uri, modification time in ms when it was taken)``: the batch's
        offset names the last entry of the source's log it covers, and the
        batch before names the last one before it."""

        def log_offset(batch: int) -> int:
            text = read_text(self.spark, f"{self.path}/offsets/{batch}")
            if batch < 0 or text is None:
                return -1
            return int(json.loads(text.splitlines()[2])["logOffset"])

        taken: list[tuple[str, int]] = []
        for entry in range(log_offset(batch_id - 1) + 1, log_offset(batch_id) + 1):
            log = f"{self.path}/sources/0/{entry}"
            text = read_text(self.spark, log) or read_text(self.spark, f"{log}.compact") or ""
            for line in text.splitlines()[1:]:  # the first is the log's version
                item = json.loads(line)
                if item["batchId"] == entry:
                    taken.append((canonical(item["path"]), int(item["timestamp"])))
        return taken

    def record_path(self, name: str) -> str:
        """Where the job keeps its record ``name``, beside Spark's own."""
        return f"{self.path}/{INPUT_RECORD[0]}/{name}"

    def record(self, name: str) -> Any:
        """One of the job's records (JSON), or None before it is first kept."""
        text = read_text(self.spark, self.record_path(name))
        return None if text is None else json.loads(text)

    def keep(self, name: str, value: Any) -> None:
        write_text(self.spark, self.record_path(name), json.dumps(value, indent=1))
