"""A file stream's intake: the files of an input directory as a streaming
DataFrame, with nothing skipped without a trace.

- *age*: Spark's file source leaves out a new file stamped more than
  ``maxFileAge`` (7 days) before the newest it took; the stream sets it so
  far that every new file is taken, whatever its modification time;
- *schema*: JSON lines are read with a schema known before any file is
  there (:func:`json_schema`), and a Parquet stream's is that of the first
  file it reads; either is recorded in the checkpoint at the first start and
  kept for the checkpoint's life: a restart whose options would change it is
  refused, naming the change, and a Parquet file that does not fit it cannot
  be read (below);
- *unreadable files*: a micro-batch that fails while reading its files has
  them read again, to find those that cannot be read (those the error names,
  alone; else all of them, then halves, down to single files); each is
  recorded in the checkpoint with its reason, dead-lettered by name in that
  batch's results, and left out of the stream from then on (Spark prunes it
  by its ``_metadata.file_path``), so that the batch runs again without it
  and the stream goes on;
- *files written to after they were taken*: Spark reads a file once, as it
  is when listed; the files of each micro-batch are looked at again when the
  next starts and when the stream stops, and one written to since is told.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, Final

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from ._checkpoint import Checkpoint
from ._checks import INPUT_RECORD
from ._files import exists, glob_escaped, listed, shown
from ._input import json_schema, messages_of

__all__ = ["FileIntake", "Unreadable", "failure_reason"]

_log = logging.getLogger(__name__)

#: Spark's file source takes no new file stamped more than this before the
#: newest it took (its default is 7 days): a hundred years is "any".
NO_MAX_AGE: Final = "36500d"
_FORMATS: Final = {"json": "JSON lines", "parquet": "Parquet"}
#: The job's records in the checkpoint (beside the input's, ``INPUT_RECORD``).
_UNREADABLE: Final = "unreadable.json"
_WRITTEN_AFTER: Final = "written-after-taken.json"
#: A read that failed because the storage could not be reached, not because of
#: the file: the stream stops (to be run again) instead of refusing the file.
_OUTAGE: Final = re.compile(
    r"java\.net\.|SocketTimeout|ConnectException|UnknownHost|Connection (reset|refused)"
    r"|timed out|Throttl|ServerBusy|Service ?Unavailable",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Unreadable:
    """A file the stream could not read: its URI (as Spark's file metadata
    names it), the micro-batch that met it, and why."""

    uri: str
    batch: int
    reason: str


def _java(exc: BaseException) -> Any:
    """The JVM's exception behind a PySpark one, if any."""
    return getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)


def _whole_text(spark: SparkSession, exc: BaseException) -> str:
    """An error's message with its JVM stack traces, causes and the failed
    tasks' included (PySpark may show only the first line)."""
    java = _java(exc)
    if java is None:
        return str(exc)
    jvm: Any = spark.sparkContext._jvm
    return str(jvm.org.apache.commons.lang3.exception.ExceptionUtils.getStackTrace(java))


def failure_reason(exc: BaseException) -> str:
    """The innermost error with a message in Spark's chain of causes (the one
    that says what is wrong with the file), as one line."""
    java = _java(exc)
    reason = None
    while java is not None:
        message = java.getMessage()
        if message:
            name = str(java.getClass().getSimpleName())
            reason = f"{name}: {' '.join(str(message).split())}"
        java = java.getCause()
    if reason is None:
        lines = str(exc).strip().splitlines()
        reason = lines[0] if lines else type(exc).__name__
    return reason if len(reason) <= 500 else reason[:500] + "..."


class FileIntake:
    """The stream over ``path``, its schema and its unreadable files, kept in
    ``checkpoint``."""

    def __init__(
        self,
        spark: SparkSession,
        path: str,
        checkpoint: str,
        input_format: str,
        order_by: str | None = None,
        sent_at: str | None = None,
        max_files_per_trigger: int | None = None,
    ) -> None:
        if input_format not in _FORMATS:
            raise ValueError(f"input format must be 'json' or 'parquet', got {input_format!r}")
        self.spark, self.path, self.checkpoint = spark, path, Checkpoint(spark, checkpoint)
        self.input_format, self.order_by, self.sent_at = input_format, order_by, sent_at
        self.max_files_per_trigger = max_files_per_trigger
        kept = self.checkpoint.record(_UNREADABLE) or []
        self.unreadable = [Unreadable(**entry) for entry in kept]
        self._told: list[str] = self.checkpoint.record(_WRITTEN_AFTER) or []
        self._looked_at: int | None = None
        self._schema: StructType | None = None

    # --- the schema, for the life of the checkpoint ---------------------------------

    def schema(self) -> StructType | None:
        """The stream's schema: the one recorded at the checkpoint's first
        start, else this run's (recorded now); None for a Parquet stream with
        no Parquet file to take it from yet."""
        if self._schema is not None:
            return self._schema
        recorded = self.checkpoint.record(INPUT_RECORD[1])
        if recorded is not None:
            self._schema = self._kept(recorded)
            return self._schema
        schema = (
            self._first_parquet_schema()
            if self.input_format == "parquet"
            else json_schema(self.order_by, self.sent_at)
        )
        if schema is None:
            return None
        record = {"format": self.input_format, "schema": schema.jsonValue()}
        self.checkpoint.keep(INPUT_RECORD[1], record)
        self._schema = schema
        return schema

    def wait_for_schema(self, every: timedelta | None, stop: threading.Event | None) -> bool:
        """Whether the schema is known; a Parquet stream on a folder without a
        Parquet file looks again ``every`` so often until ``stop`` is set."""
        while self.schema() is None:
            if every is None or stop is None or stop.wait(every.total_seconds()):
                return False
        return True

    def _kept(self, record: dict[str, Any]) -> StructType:
        """The recorded schema, or a refusal when this run's options change it."""
        kept = StructType.fromJson(record["schema"])
        where = self.checkpoint.record_path(INPUT_RECORD[1])
        how = f"(to start afresh, remove {where!r}: the next start records its own)"
        if record["format"] != self.input_format:
            raise ValueError(
                f"checkpoint {self.checkpoint.path!r} reads {_FORMATS[record['format']]}, not "
                f"{_FORMATS[self.input_format]}: a checkpoint's input is fixed for its life {how}"
            )
        if self.input_format == "json":
            wanted = json_schema(self.order_by, self.sent_at)
            if wanted != kept:
                before, now = set(kept.fieldNames()), set(wanted.fieldNames())
                change = "; ".join(
                    [f"column {c!r} is new" for c in sorted(now - before)]
                    + [f"column {c!r} is gone" for c in sorted(before - now)]
                )
                raise ValueError(
                    f"checkpoint {self.checkpoint.path!r} was started with the input columns "
                    f"{kept.fieldNames()}; this run's options change them ({change}): "
                    f"give the --order-by and --sent-at it was started with {how}"
                )
        return kept

    def _first_parquet_schema(self) -> StructType | None:
        """The schema of the oldest file in the folder that reads as Parquet."""
        for uri, _ in listed(self.spark, self.path):
            try:
                return self.spark.read.parquet(glob_escaped(shown(self.spark, uri))).schema
            except Exception as exc:  # not Parquet: the stream dead-letters it once it starts
                _log.info("the stream's schema is not taken from %s: %s", uri, failure_reason(exc))
        return None

    # --- the stream -----------------------------------------------------------------

    def frame(self) -> DataFrame:
        """The streaming DataFrame of the messages, without the unreadable files."""
        schema = self.schema()
        if schema is None:
            raise ValueError(f"input {self.path!r} has no Parquet file to take the schema from")
        reader = self.spark.readStream.option("maxFileAge", NO_MAX_AGE)
        if self.max_files_per_trigger is not None:
            reader = reader.option("maxFilesPerTrigger", str(self.max_files_per_trigger))
        if self.input_format == "json":
            files = reader.text(self.path)
        else:
            files = reader.schema(schema).parquet(self.path)
        if self.unreadable:
            # A filter on the file's metadata alone: Spark does not even open those files.
            path = F.regexp_replace(F.col("_metadata.file_path"), "^file:///", "file:/")
            files = files.where(~path.isin([entry.uri for entry in self.unreadable]))
        return messages_of(files, self.input_format, self.path, self.order_by, self.sent_at)

    def unreadable_in(self, batch_id: int) -> list[Unreadable]:
        return [entry for entry in self.unreadable if entry.batch == batch_id]

    # --- files written to after the stream took them --------------------------------

    def written_after_taken(self) -> list[str]:
        """A line for each file of the last committed micro-batch (looked at
        once) that was written to after the stream took it: what was written
        after is never read. Each file is told once, and logged."""
        batch = self.checkpoint.last_committed()
        if batch is None or batch == self._looked_at:
            return []
        self._looked_at = batch
        now = dict(listed(self.spark, self.path))
        lines = []
        for uri, taken in self.checkpoint.taken_in(batch):
            if uri in self._told or now.get(uri, taken) <= taken:
                continue  # unchanged, told already, or moved away (processed files may be)
            self._told.append(uri)
            lines.append(
                f"{shown(self.spark, uri)} was written to {(now[uri] - taken) / 1000:g} s after "
                f"micro-batch {batch} took it: what was written after is not read (write files "
                "elsewhere and rename them in: see How files must land)"
            )
            _log.warning("%s", lines[-1])
        if lines:
            self.checkpoint.keep(_WRITTEN_AFTER, self._told)
        return lines

    # --- the files a failed micro-batch could not read ------------------------------

    def examine(self, error: BaseException) -> list[Unreadable]:
        """The files that cannot be read of the micro-batch the query failed
        in with ``error``, found and recorded; none when the error was not the
        files' (the query then fails as it did)."""
        text = _whole_text(self.spark, error)
        batch_id = self.checkpoint.uncommitted()
        # Only an error raised while reading the files (Spark may read them
        # before the sink is called, or inside it).
        if "FileScanRDD" not in text or batch_id is None:
            return []
        excluded = {entry.uri for entry in self.unreadable}
        files = [uri for uri, _ in self.checkpoint.taken_in(batch_id) if uri not in excluded]
        named = [uri for uri in files if uri in text or shown(self.spark, uri) in text]
        found = [(uri, reason) for uri in named if (reason := self._unread([uri])) is not None]
        if not found:
            found = self._halves(files)
        if not found or any(_OUTAGE.search(reason) for _, reason in found):
            return []
        what = "JSON lines" if self.input_format == "json" else "Parquet of the stream's schema"
        new = [Unreadable(uri, batch_id, f"the file cannot be read as {what}: {why}")
               for uri, why in found]  # fmt: skip
        for entry in new:
            _log.warning("%s is dead-lettered: %s", shown(self.spark, entry.uri), entry.reason)
        self.unreadable.extend(new)
        self.checkpoint.keep(_UNREADABLE, [asdict(entry) for entry in self.unreadable])
        return new

    def _halves(self, files: list[str]) -> list[tuple[str, str]]:
        """The files that cannot be read, each with its reason: all of them are
        read, then each half of those that fail, down to single files."""
        reason = self._unread(files)
        if reason is None:
            return []
        if len(files) == 1:
            return [(files[0], reason)]
        middle = len(files) // 2
        return self._halves(files[:middle]) + self._halves(files[middle:])

    def _unread(self, files: list[str]) -> str | None:
        """Why ``files`` cannot be read together, as the stream reads them; None if they can."""
        gone = [uri for uri in files if not exists(self.spark, uri)]
        if gone:
            return "the file was removed before it was read"
        paths = [glob_escaped(shown(self.spark, uri)) for uri in files]
        reader = self.spark.read
        try:
            if self.input_format == "json":
                frame = reader.text(paths)
            else:
                schema = self.schema()
                assert schema is not None  # a Parquet stream started only once it had one
                frame = reader.schema(schema).parquet(*paths)
            frame.write.format("noop").mode("overwrite").save()
        except Exception as exc:  # any failure to read them is their reason
            return failure_reason(exc)
        return None
