"""A file stream's intake: the files of an input directory as a streaming
DataFrame, with nothing skipped without a trace.

- *age*: Spark's file source leaves out a new file stamped more than
  ``maxFileAge`` (7 days) before the newest it took; the stream sets it so
  far that every new file is taken, whatever its modification time;
- *schema*: JSON lines are read with a schema known before any file is
  there (:func:`json_schema`), and a Parquet stream's is that of the oldest
  file with the message columns (and those the options name); either is
  recorded in the checkpoint at the first start and kept for the
  checkpoint's life: a restart whose options would change its columns is
  refused, naming the change, and a Parquet file that does not fit it cannot
  be read (below);
- *files looked at first* (``_landing``): before a micro-batch's messages
  reach the handlers, a Parquet file without those columns, a line too
  long to read, and a file of the folder Spark's listing leaves out for its
  name are each recorded and dead-lettered by name in that batch; a file
  not to be read at all makes the batch run again without it;
- *unreadable files*: a micro-batch that fails while reading its files has
  them read again, to find those that cannot be read (those the error names,
  alone; else all of them, then halves, down to single files; a local name
  with ``:`` is told without reading it, as Hadoop cannot open it); each is
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
import threading
from datetime import timedelta
from typing import Final

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from .._input import HEADERS_COLUMN, INPUT_SCHEMA, LINE_OPTIONS, json_schema, messages_of
from ._checkpoint import FORMATS, INPUT, Checkpoint, Unreadable
from ._failures import OUTAGE, failure_reason, whole_text
from ._fs import exists, glob_escaped, listed, local, shown
from ._landing import colon_in_name, lacks_columns, long_lines, misnamed

__all__ = ["FileIntake", "LeftOut", "Unreadable"]

_log = logging.getLogger(__name__)

#: Spark's file source takes no new file stamped more than this before the
#: newest it took (its default is 7 days): a hundred years is "any".
NO_MAX_AGE: Final = "36500d"


class LeftOut(RuntimeError):
    """Raised by the sink before a micro-batch reads its files, when one is
    not to be read: the batch runs again without it."""


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
        if input_format not in FORMATS:
            raise ValueError(f"input format must be 'json' or 'parquet', got {input_format!r}")
        if glob_escaped(path) != path:
            # Escaped, Spark's file source lists the folder, then reads each file as often
            # as the batch has files; unescaped, it reads nothing (a batch run reads it whole).
            raise ValueError(
                f"input {path!r} holds a character Spark's streaming file source reads as a "
                "pattern (* ? [ ] { } \\): a stream cannot read that folder; rename it"
            )
        self.spark, self.path, self.checkpoint = spark, path, Checkpoint(spark, checkpoint)
        self.input_format, self.order_by, self.sent_at = input_format, order_by, sent_at
        self.max_files_per_trigger = max_files_per_trigger
        self.unreadable = self.checkpoint.unreadable()
        self._told = self.checkpoint.told()
        self._looked_at: int | None = None
        self._schema: StructType | None = None
        self._listed: set[str] = set()  # names found in Spark's listing
        # The columns a file must have: the messages', and those the options name.
        named = [name for name in (order_by, sent_at) if name is not None]
        self.columns = list(dict.fromkeys([*INPUT_SCHEMA.fieldNames(), *named]))

    # --- the schema, for the life of the checkpoint ---------------------------------

    def schema(self) -> StructType | None:
        """The stream's schema: the one recorded at the checkpoint's first
        start, else this run's (recorded now); None for a Parquet stream with
        no Parquet file to take it from yet."""
        if self._schema is not None:
            return self._schema
        recorded = self.checkpoint.input()
        # A Parquet schema without the message columns (as an earlier version
        # could record) never started a query: it is taken afresh.
        message = set(INPUT_SCHEMA.fieldNames())
        if recorded is not None and message <= set(recorded[1].fieldNames()):
            self._schema = self._kept(*recorded)
            return self._schema
        schema = (
            self._first_parquet_schema()
            if self.input_format == "parquet"
            else json_schema(self.order_by, self.sent_at)
        )
        if schema is None:
            return None
        self.checkpoint.keep_input(self.input_format, schema)
        self._schema = schema
        return schema

    def wait_for_schema(self, every: timedelta | None, stop: threading.Event | None) -> bool:
        """Whether the schema is known; a Parquet stream on a folder without a
        Parquet file looks again ``every`` so often until ``stop`` is set."""
        while self.schema() is None:
            if every is None or stop is None or stop.wait(every.total_seconds()):
                return False
        return True

    def _lacking(self, schema: StructType) -> list[str]:
        return [column for column in self.columns if column not in schema.fieldNames()]

    def _kept(self, input_format: str, kept: StructType) -> StructType:
        """The recorded schema, or a refusal when this run's options change it."""
        where = self.checkpoint.record_path(INPUT)
        how = f"(to start afresh, remove {where!r}: the next start records its own)"
        if input_format != self.input_format:
            raise ValueError(
                f"checkpoint {self.checkpoint.path!r} reads {FORMATS[input_format]}, not "
                f"{FORMATS[self.input_format]}: a checkpoint's input is fixed for its life {how}"
            )
        if self.input_format == "json":
            # The columns, not their order: --order-by and --sent-at may swap
            # theirs. Headers are read whatever was recorded (before they were).
            before = set(kept.fieldNames()) - {HEADERS_COLUMN}
            now = set(json_schema(self.order_by, self.sent_at).fieldNames()) - {HEADERS_COLUMN}
            if before != now:
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
        """The schema of the oldest file in the folder that reads as Parquet
        and has the columns; the stream dead-letters the others it meets."""
        for uri, _ in listed(self.spark, self.path):
            if colon_in_name(uri) is not None:
                continue
            try:
                schema = self.spark.read.parquet(glob_escaped(shown(self.spark, uri))).schema
            except Exception as exc:  # not Parquet
                _log.info("the stream's schema is not taken from %s: %s", uri, failure_reason(exc))
                continue
            lacking = self._lacking(schema)
            if not lacking:
                return schema
            _log.info("the stream's schema is not taken from %s: it lacks %s", uri, lacking)
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
            files = reader.options(**LINE_OPTIONS).text(self.path)
        else:
            files = reader.schema(schema).parquet(self.path)
        left_out = [entry.uri for entry in self.unreadable if entry.whole]
        if left_out:
            # A filter on the file's metadata alone: Spark does not even open those files.
            path = F.regexp_replace(F.col("_metadata.file_path"), "^file:///", "file:/")
            files = files.where(~path.isin(left_out))
        return messages_of(files, self.input_format, self.path, self.order_by, self.sent_at)

    def unreadable_in(self, batch_id: int) -> list[Unreadable]:
        return [entry for entry in self.unreadable if entry.batch == batch_id]

    # --- the files looked at before a micro-batch reads them ------------------------

    def look_at(self, batch_id: int) -> bool:
        """Before micro-batch ``batch_id``'s messages reach the handlers (Spark
        has read its files, up to the shuffle by key): its files not to be
        read, or not whole, and the files of the folder Spark's listing
        leaves out, each recorded once with the batch and logged; whether a
        file of the batch is not to be read at all (the batch must then run
        again without it)."""
        known = {entry.uri for entry in self.unreadable}
        new = []
        for uri, _ in self.checkpoint.taken_in(batch_id):
            found = None if uri in known else self._unfit(uri)
            if found is not None:
                new.append(Unreadable(uri, batch_id, *found))
        again = any(entry.whole for entry in new)
        new += [Unreadable(uri, batch_id, why) for uri, why in
                misnamed(self.spark, self.path, self._listed) if uri not in known]  # fmt: skip
        if new:
            for entry in new:
                _log.warning("%s is dead-lettered: %s", shown(self.spark, entry.uri), entry.reason)
            self.unreadable.extend(new)
            self.checkpoint.keep_unreadable(self.unreadable)
        return again

    def tell_unlisted(self) -> None:
        """As the stream stops: each file of the folder Spark's listing leaves
        out that no micro-batch has dead-lettered yet (the next one will)."""
        known = {entry.uri for entry in self.unreadable}
        for uri, why in misnamed(self.spark, self.path, self._listed):
            if uri not in known:
                _log.warning("%s is not read: %s; the next micro-batch dead-letters it",
                             shown(self.spark, uri), why)  # fmt: skip

    def _unfit(self, uri: str) -> tuple[str, bool] | None:
        """Why a file of a micro-batch is not read, and whether at all."""
        if self.input_format == "parquet":
            lacking = lacks_columns(self.spark, uri, self.columns)
            return None if lacking is None else (lacking, True)
        path = local(uri)
        try:
            lines = None if path is None else long_lines(path)
        except Exception:  # a file that cannot be read: Spark's read tells why
            return None
        return None if lines is None else (lines, False)

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
            self.checkpoint.keep_told(self._told)
        return lines

    # --- the files a failed micro-batch could not read ------------------------------

    def examine(self, error: BaseException) -> list[Unreadable]:
        """The files that cannot be read of the micro-batch the query failed
        in with ``error``, found and recorded; none when the error was not the
        files' (the query then fails as it did)."""
        text = whole_text(self.spark, error)
        batch_id = self.checkpoint.uncommitted()
        # Only an error raised while reading the files (Spark may read them
        # before the sink is called, or inside it).
        if "FileScanRDD" not in text or batch_id is None:
            return []
        excluded = {entry.uri for entry in self.unreadable if entry.whole}
        files = [uri for uri, _ in self.checkpoint.taken_in(batch_id) if uri not in excluded]
        named = [uri for uri in files if uri in text or shown(self.spark, uri) in text]
        found = [(uri, reason) for uri in named if (reason := self._unread([uri])) is not None]
        if not found:
            found = self._halves(files)
        if not found or any(OUTAGE.search(reason) for _, reason in found):
            return []
        what = "JSON lines" if self.input_format == "json" else "Parquet of the stream's schema"
        new = [Unreadable(uri, batch_id, f"the file cannot be read as {what}: {why}")
               for uri, why in found]  # fmt: skip
        for entry in new:
            _log.warning("%s is dead-lettered: %s", shown(self.spark, entry.uri), entry.reason)
        self.unreadable.extend(new)
        self.checkpoint.keep_unreadable(self.unreadable)
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
        colons = [reason for uri in files if (reason := colon_in_name(uri)) is not None]
        if colons:  # Spark reads the files before the sink can leave them out: told here
            return colons[0]
        paths = [glob_escaped(shown(self.spark, uri)) for uri in files]
        reader = self.spark.read
        try:
            if self.input_format == "json":
                frame = reader.options(**LINE_OPTIONS).text(paths)
            else:
                schema = self.schema()
                assert schema is not None  # a Parquet stream started only once it had one
                frame = reader.schema(schema).parquet(*paths)
            frame.write.format("noop").mode("overwrite").save()
        except Exception as exc:  # any failure to read them is their reason
            return failure_reason(exc)
        return None
