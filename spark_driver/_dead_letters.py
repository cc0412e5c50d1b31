"""The job's dead letters fed back: each as the input line the batch job
reads, to be fixed and run again, with the message id it had.

A dead letter's ``raw`` (``_tasks._rows.raw_input``) is one of three things:

- *an input line*: the line as read (one that did not parse, or whose bytes
  are not UTF-8, escaped), or for a row that parsed its four columns as one
  JSON line. It is fed back as it is: a line that named its id keeps it;
- *a queue message's text* (the queue source's dead letters): it is fed
  back as a line of the four columns with the id the job gave the message,
  the envelope's own or, for an envelope without one, its queue message's
  (``handlers.admit_text``'s ``default_id``), so that the message fed back
  is the message the job refused, and a copy of one that was in fact
  processed is a duplicate;
- *a file's path*: the file as a whole could not be read (a name Spark
  cannot list or open, a line over 8 MiB, a file cut short: see
  ``_files._landing``). That is no line to feed back: it is kept with its
  ``file`` and a ``note`` that says what to do, never left out silently.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from typing import Any, Final

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from handlers import Message, read_queue_text

from ._files._fs import create_in_new, names
from ._tasks._executor import RESULT_SCHEMA

__all__ = ["DEAD_LETTER_SCHEMA", "fed_back", "read_dead_letters", "write_dead_letters"]

_log = logging.getLogger(__name__)

#: The dead letters as ``write_result`` writes them (``JobResult.dead_letters``:
#: the outcome columns of the tasks' rows, the body as ``raw``).
_OUTCOME_COLUMNS: Final = ("message_id", "key", "type", "status", "version", "reason", "conflicts")
_WRITTEN: Final = StructType(
    [
        *(RESULT_SCHEMA[name] for name in _OUTCOME_COLUMNS),
        StructField("raw", StringType()),
    ]
)

#: One row per dead letter: the line to feed back, or why there is none.
DEAD_LETTER_SCHEMA: Final = StructType(
    [
        # The id the line is fed back with; null: the line gave none that parsed.
        StructField("message_id", StringType()),
        StructField("key", StringType()),
        StructField("type", StringType()),
        StructField("reason", StringType()),
        # The input line to fix and feed back; null: there is none (see ``note``).
        StructField("line", StringType()),
        # A whole file's path, when the file was dead-lettered as a whole.
        StructField("file", StringType()),
        # Why ``line`` is null, or what it leaves out; null: the line is the whole input.
        StructField("note", StringType()),
    ]
)

#: How much text goes to the file system in one write (the driver's writes cross to the JVM).
_CHUNK: Final = 1 << 20


def _holds_bytes(value: Any) -> bool:
    if isinstance(value, bytes | bytearray):
        return True
    if isinstance(value, dict):
        return any(_holds_bytes(item) for item in value.values())
    if isinstance(value, list | tuple):
        return any(_holds_bytes(item) for item in value)
    return False


def _names_its_id(raw: str, message_id: str) -> bool:
    """Whether ``raw`` is a JSON object whose ``message_id`` is the dead
    letter's: an input line (an envelope may hold a field of that name)."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return False
    return isinstance(data, dict) and data.get("message_id") == message_id


def _as_line(message: Message) -> tuple[str | None, str | None]:
    """A queue message as an input line, and what the line leaves out."""
    if _holds_bytes(message.body):
        return None, (
            "a queue message whose body holds bytes, which a JSON line cannot carry: "
            "send it back to its queue instead"
        )
    body = message.body
    fields = {
        "message_id": message.id,
        "key": message.key,
        "type": message.type,
        # A line's body is read as the text of its JSON value, and a JSON
        # string as its content: a string body travels as its JSON text.
        "body": json.dumps(body, ensure_ascii=False) if isinstance(body, str) else body,
    }
    line = json.dumps(fields, ensure_ascii=False, sort_keys=True)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: escaped, the text stays exact
        line = json.dumps(fields, sort_keys=True)
    left = [
        name
        for name, value in (
            ("headers", message.headers), ("due", message.due), ("produced", message.produced),
        )
        if value
    ]  # fmt: skip
    if not left:
        return line, None
    return line, f"a queue message: its {', '.join(left)} do not travel in an input line"


def fed_back(letter: Any) -> tuple[Any, ...]:
    """A written dead letter (``message_id``, ``key``, ``type``, ``reason``,
    ``conflicts``, ``raw``) as a row of :data:`DEAD_LETTER_SCHEMA`."""
    message_id, key, type_, reason, raw = (
        letter["message_id"], letter["key"], letter["type"], letter["reason"], letter["raw"],
    )  # fmt: skip
    row = (message_id, key, type_, reason)
    # A file's dead letter (``_files._landing.dead_letters``) counts no
    # conflicts and names no message; a line's always counts its conflicts.
    if letter["conflicts"] is None and message_id is None:
        whole = (
            f"the file as a whole ({reason}): fix or rename it and run the job over it "
            "again; its messages that were processed are duplicates"
        )
        return (*row, None, raw, whole)
    if message_id is None or _names_its_id(raw, message_id):
        return (*row, raw, None, None)
    try:  # a queue message's text, read as the job read it
        message = read_queue_text(raw, default_id=message_id)
    except ValueError as exc:
        return (*row, None, None, f"the queue message's text does not read: {exc}")
    line, left_out = _as_line(message)
    return (*row, line, None, left_out)


def _folders(spark: SparkSession, output: str) -> list[str]:
    """The dead-letter folders of a run's ``output``: a batch run's one, or a
    stream's, one per micro-batch (``batch=N``), in batch order."""
    held = names(spark, output)
    if "dead_letters" in held:
        return [f"{output}/dead_letters"]
    batches = sorted(
        (name for name in held if name.startswith("batch=") and name[6:].isdigit()),
        key=lambda name: int(name[6:]),
    )
    found = [f"{output}/{b}/dead_letters" for b in batches
             if "dead_letters" in names(spark, f"{output}/{b}")]  # fmt: skip
    if not found and not batches:
        raise ValueError(
            f"{output!r} holds no dead_letters folder, nor batch=N/dead_letters: "
            "give the output folder of a run (--output)"
        )
    return found


def read_dead_letters(
    spark: SparkSession, output: str, *, output_format: str = "parquet"
) -> DataFrame:
    """The dead letters of a run whose output is ``output`` (``--output``: a
    batch run's, or a stream's, whose micro-batches each hold theirs), as
    input lines to fix and feed back (:data:`DEAD_LETTER_SCHEMA`).

    Each line keeps the id its message had, so a line fed back twice, or one
    whose message was in fact processed, is a duplicate. A dead letter that is
    no line (a whole file, a queue message a line cannot carry) has ``line``
    null and a ``note`` that says why and what to do. They come ordered by
    key and message id, as the dead-letter folder holds them (the input's
    order within a key is not kept there)."""
    if output_format not in ("parquet", "json"):
        raise ValueError(f"output format must be 'parquet' or 'json', got {output_format!r}")
    folders = _folders(spark, output)
    if not folders:
        return spark.createDataFrame([], DEAD_LETTER_SCHEMA)
    written = spark.read.schema(_WRITTEN).format(output_format).load(folders)

    def feed(rows: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
        return (fed_back(row) for row in rows)

    # In the order a key's lines are fed back in (a dead-letter folder is in
    # that order, but a folder read back is not, nor are a stream's batches).
    letters = spark.createDataFrame(written.rdd.mapPartitions(feed), DEAD_LETTER_SCHEMA)
    return letters.orderBy("key", "message_id", "line", "file")


def write_dead_letters(letters: DataFrame, path: str) -> list[Row]:
    """Write the ``line`` of each of ``letters`` that has one, in order, as one
    JSON-lines file ``dead_letters.jsonl`` in the new folder ``path``: the
    input of a batch run (``run_batch``, ``--input``) once they are fixed (the
    file edited in place, or ``letters``' ``line`` fixed before). The rows
    without a line are logged, each with its note, and returned.

    The file is written from the driver, without Hadoop's checksum beside it,
    so that an edited file reads as edited."""
    if "line" not in letters.columns:
        raise ValueError(
            f"letters must have a 'line' column (see read_dead_letters), got {letters.columns}"
        )
    stream = create_in_new(letters.sparkSession, path, "dead_letters.jsonl")
    try:
        left = letters.where(F.col("line").isNull()).collect()
        for row in left:
            given = row.asDict()
            what = given.get("file") or f"message {given.get('message_id')!r}"
            _log.warning("dead letter %s is not written to %s: %s", what, path, given.get("note"))
        chunk: list[str] = []
        size = 0
        for row in letters.where(F.col("line").isNotNull()).select("line").toLocalIterator():
            chunk.append(row["line"] + "\n")
            size += len(row["line"])
            if size >= _CHUNK:
                stream.write(bytearray("".join(chunk).encode("utf-8")))
                chunk, size = [], 0
        stream.write(bytearray("".join(chunk).encode("utf-8")))
    finally:
        stream.close()
    return left
