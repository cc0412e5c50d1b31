"""Where messages enter the job: the input files read as DataFrames (batch and
stream), and the columns the executors read from them.

Three things are decided here, once for both modes:

- *text*: every text column the executors read is checked to be valid
  UTF-8 in Spark, before Python sees it. Spark hands Python a string with
  bytes that are not UTF-8 as U+FFFD, so two different ids would become one;
  instead the row names its first bad column (:data:`NOT_UTF8`) and keeps
  its bytes (:data:`NOT_UTF8_BYTES`), and the executor dead-letters it;
- *order*: without ``order_by``, a key's messages apply in the order of
  their files (oldest modification time first, as Spark's file source takes
  them; then by path), then of their lines, whatever the files' sizes and
  however they were cut into micro-batches (:data:`FILE_ORDER`);
- *sent time*: the optional sent-time column, as the executors read it;
- *headers*: the optional ``headers`` column (:data:`HEADERS`), as JSON text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ._files._fs import glob_escaped

__all__ = [
    "CORRUPT_RECORD",
    "FILE_ORDER",
    "HEADERS",
    "HEADERS_COLUMN",
    "INPUT_FORMATS",
    "INPUT_SCHEMA",
    "LINE",
    "LINE_OPTIONS",
    "MAX_LINE",
    "NOT_UTF8",
    "NOT_UTF8_BYTES",
    "QUEUE_TEXT",
    "RAW",
    "SENT_AT",
    "input_order",
    "json_schema",
    "message_columns",
    "messages_of",
    "read_messages",
]

INPUT_SCHEMA = StructType(
    [
        StructField("message_id", StringType()),
        StructField("key", StringType()),
        StructField("type", StringType()),
        StructField("body", StringType()),
    ]
)
#: The optional input column of a message's headers (string to string): a
#: JSON object in JSON lines, a map (or its JSON text) in Parquet. The job's
#: own output rows carry their ``ss-token`` and trace context there, so its
#: output files can be fed back as input. An input without it reads as before.
HEADERS_COLUMN: Final = "headers"
#: The headers as the executors read them: JSON text (null: none).
HEADERS: Final = "_headers"
INPUT_FORMATS = ("json", "parquet")
#: The longest line read from JSON lines, in bytes: far above what a message
#: can carry (Azure's 4 MiB transaction), and small enough to hold in memory.
MAX_LINE: Final = 8 * 1024 * 1024
#: Hadoop's line reader skips a line of at least this many bytes with its end
#: of line, holding no more of it than that; the job leaves out any line over
#: MAX_LINE itself (:func:`messages_of`), whatever its end of line, so the
#: bound is exact.
LINE_OPTIONS: Final = {"mapreduce.input.linerecordreader.line.maxlength": str(MAX_LINE + 3)}

#: Where Spark's JSON reader keeps a line it could not parse (PERMISSIVE mode).
CORRUPT_RECORD = "_corrupt_record"
#: The line the executors dead-letter as unparseable (null: the line parsed).
RAW = "_raw"
#: Each JSON line as read, whether it parsed or not.
LINE = "_line"
#: The column the executors read a message's sent time from (see ``JobSettings.sent_at``).
SENT_AT = "_sent_at"
#: The first text column of a row that is not valid UTF-8 (null: all are), and its bytes.
NOT_UTF8 = "_not_utf8"
NOT_UTF8_BYTES = "_not_utf8_bytes"
#: A queue message's text, from the queue source's ``queue_text``: the
#: executors read the message from it as a queue consumer does.
QUEUE_TEXT = "_queue_text"
#: Each row's file: modification time, path and the offset of its split; with
#: the row's place in its partition, the input order (see the module's doc).
FILE_ORDER = ("_file_time", "_file_path", "_file_block")
_FILE_METADATA = ("file_modification_time", "file_path", "file_block_start")


def json_schema(*extra: str | None) -> StructType:
    """The columns read from JSON lines: the four message columns, then each
    ``extra`` column (an ordering or a sent-time column) not among them, all as
    text; then :data:`HEADERS_COLUMN` (as text) and :data:`CORRUPT_RECORD`.

    Nothing is inferred from the files, so the schema is known before any file
    is there, and a later line cannot change it. Text keeps any JSON value as
    written: a body's raw JSON; an ordering column's numbers, ordered by value
    (:func:`input_order`); a sent time's ISO-8601 text.
    """
    known = [*INPUT_SCHEMA.fieldNames(), HEADERS_COLUMN]
    named = [name for name in dict.fromkeys(extra) if name and name not in known]
    return StructType(
        [
            *INPUT_SCHEMA.fields,
            *(StructField(name, StringType()) for name in named),
            StructField(HEADERS_COLUMN, StringType()),
            StructField(CORRUPT_RECORD, StringType()),
        ]
    )


def _located(frame: DataFrame) -> list[Column]:
    """The file each row came from, for the input order: a file source's hidden
    metadata, to select before anything else is done to the frame."""
    metadata = zip(_FILE_METADATA, FILE_ORDER, strict=True)
    return [F.col(f"_metadata.{m}").alias(c) for m, c in metadata]


def _json_lines(lines: DataFrame, schema: StructType) -> DataFrame:
    """JSON lines parsed from a text source's ``value``, keeping each line
    (:data:`LINE`) to check its bytes: Spark's JSON reader turns some bytes
    that are not UTF-8 into ``?`` without a trace, so the columns alone
    cannot tell. A line that is not a JSON object keeps its text in
    CORRUPT_RECORD; blank lines are skipped, as the JSON reader does."""
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_RECORD}
    # A line over MAX_LINE is left out whatever its end of line (Hadoop's
    # reader skips longer ones only): the job tells it by its file (_landing).
    kept = (F.trim(F.col("value")) != "") & (F.octet_length("value") <= MAX_LINE)
    located = lines.select("value", *_located(lines)).where(kept)
    return located.select(
        F.from_json(F.col("value"), schema, options).alias("_message"),
        F.col("value").alias(LINE),
        *FILE_ORDER,
    ).select("_message.*", LINE, *FILE_ORDER)


def _checked(frame: DataFrame, path: str, extra: Sequence[tuple[str, str | None]]) -> DataFrame:
    missing = [c for c in INPUT_SCHEMA.fieldNames() if c not in frame.columns]
    if missing:
        raise ValueError(f"input {path!r} lacks the columns {missing}")
    for what, name in extra:
        if name is not None and name not in frame.columns:
            raise ValueError(
                f"{what} column {name!r} is not in the input {path!r} (columns: {frame.columns})"
            )
    return frame


def _check_format(input_format: str) -> None:
    if input_format not in INPUT_FORMATS:
        raise ValueError(f"input format must be 'json' or 'parquet', got {input_format!r}")


def messages_of(
    files: DataFrame,
    input_format: str,
    path: str,
    order_by: str | None = None,
    sent_at: str | None = None,
) -> DataFrame:
    """The messages of a file source's DataFrame (a text source for JSON
    lines, a Parquet source), batch or stream, with :data:`FILE_ORDER`; the
    columns ``order_by`` and ``sent_at`` name are checked to be there."""
    _check_format(input_format)
    if input_format == "json":
        frame = _json_lines(files, json_schema(order_by, sent_at))
    else:
        frame = files.select("*", *_located(files))
    return _checked(frame, path, (("order", order_by), ("sent-at", sent_at)))


def read_messages(
    spark: SparkSession,
    path: str,
    input_format: str,
    order_by: str | None = None,
    sent_at: str | None = None,
    *,
    leave_out: Sequence[str] = (),
) -> DataFrame:
    """JSON lines or Parquet with at least message_id, key, type and body,
    from ``path``, a file or a folder (a name, not a pattern).

    Other columns are kept (with JSON, those ``order_by`` and ``sent_at``
    name, as text: :func:`json_schema`), so an ordering or sent-time column
    reaches :func:`process_messages`; so are the columns of
    :data:`FILE_ORDER`. A JSON input in which no line has such a column is
    refused, as a Parquet input without it is. A JSON line over
    :data:`MAX_LINE` bytes is left out; so are the files ``leave_out`` names
    (by their URIs, as Spark's ``_metadata.file_path`` gives them).
    """
    _check_format(input_format)
    literal = glob_escaped(path)  # a name, not a pattern Spark would expand
    if input_format == "parquet":
        return messages_of(spark.read.parquet(literal), input_format, path, order_by, sent_at)
    lines = spark.read.options(**LINE_OPTIONS).text(literal)
    if leave_out:  # a filter on the file's metadata alone: Spark does not open those files
        lines = lines.where(~F.col("_metadata.file_path").isin(list(leave_out)))
    frame = messages_of(lines, input_format, path, order_by, sent_at)
    for what, name in (("order", order_by), ("sent-at", sent_at)):
        missing = name is not None and frame.where(F.col(name).isNotNull()).isEmpty()
        if missing and not frame.isEmpty():
            raise ValueError(f"{what} column {name!r} is not in the input {path!r} (in no line)")
    return frame


def _sent_at_column(frame: DataFrame, name: str) -> Column:
    """A sent-time column as the executors read it: text as it is (ISO-8601,
    checked there), a timestamp as microseconds since the epoch (exact, and
    independent of the session's time zone)."""
    if name not in frame.columns:
        raise ValueError(f"sent-at column {name!r} is not in the input ({frame.columns})")
    found = frame.schema[name].dataType
    if isinstance(found, StringType):
        return F.col(name)
    if isinstance(found, TimestampType):
        return F.unix_micros(F.col(name))
    raise ValueError(
        f"sent-at column {name!r} is of type {found.simpleString()}: give a timestamp "
        "(with its time zone, Spark's TIMESTAMP) or ISO-8601 text with a zone"
    )


def _headers_column(frame: DataFrame) -> Column:
    """The headers as JSON text, from any producer's type: a map or a struct
    as its JSON (a map's null value stays null there, for the executors to
    refuse), text as it is; any other type as its text, which the executors
    refuse as no JSON object (a dead letter, not a failed job)."""
    found = frame.schema[HEADERS_COLUMN].dataType
    column = F.col(HEADERS_COLUMN)
    if isinstance(found, StringType):
        return column
    if isinstance(found, StructType | MapType | ArrayType):
        return F.to_json(column)
    return column.cast(StringType())


def message_columns(frame: DataFrame, sent_at: str | None = None) -> list[Column]:
    """The message columns as the executors read them, from any producer's types.

    Ids, keys and types of any integer or string type become strings; a body
    that is a struct, a map or an array becomes its JSON text, and any other
    non-binary body its text (a number or a boolean is valid JSON as text).
    Then :data:`RAW`, the sent time (:data:`SENT_AT`, with ``sent_at``), the
    headers (:data:`HEADERS`, with a ``headers`` column), and the UTF-8 check
    (:data:`NOT_UTF8`, :data:`NOT_UTF8_BYTES`): a text column that is not
    valid UTF-8 is null, and named there with its bytes.
    """
    columns: dict[str, Column] = {}
    texts: list[str] = []  # columns read as text, whose bytes may not be UTF-8
    checks: dict[str, Column] = {}  # the bytes each is checked on
    if LINE in frame.columns:
        # A JSON line is checked whole: its columns all come from it.
        checks[RAW] = F.col(LINE)
    for name in ("message_id", "key", "type"):
        column = F.col(name)
        if isinstance(frame.schema[name].dataType, StringType):
            texts.append(name)
        else:
            column = column.cast(StringType())
        columns[name] = column
    body = F.col("body")
    body_type = frame.schema["body"].dataType
    if isinstance(body_type, StringType):
        texts.append("body")
    elif isinstance(body_type, StructType | MapType | ArrayType):
        body = F.to_json(body)
    elif not isinstance(body_type, BinaryType):
        body = body.cast(StringType())
    columns["body"] = body
    if CORRUPT_RECORD in frame.columns:
        columns[RAW] = F.col(CORRUPT_RECORD)
    else:
        columns[RAW] = F.lit(None).cast(StringType())
    if "queue_text" in frame.columns:
        columns[QUEUE_TEXT] = F.col("queue_text")
    elif HEADERS_COLUMN in frame.columns:
        columns[HEADERS] = _headers_column(frame)
        if isinstance(frame.schema[HEADERS_COLUMN].dataType, StringType):
            texts.append(HEADERS)
    if sent_at is not None:
        columns[SENT_AT] = _sent_at_column(frame, sent_at)
        if isinstance(frame.schema[sent_at].dataType, StringType):
            texts.append(SENT_AT)
    if not checks:  # columns not parsed from a line of text: each is checked
        checks = {name: columns[name] for name in texts}
    # Spark decodes a string that is not UTF-8 with U+FFFD: comparing its bytes
    # with those of the decoded text tells. Null (a null column) counts as valid.
    valid = {n: F.encode(c, "UTF-8") == c.cast("binary") for n, c in checks.items()}
    bad = [F.when(~ok, F.lit(name)) for name, ok in valid.items()]
    bad_bytes = [F.when(~valid[name], c.cast("binary")) for name, c in checks.items()]
    # A column that is not UTF-8 is null (a JSON line that is not: all of its
    # columns), so that no text Spark made up travels on, not even in a dead letter.
    line_ok = valid.get(RAW) if LINE in frame.columns else None
    guarded = [
        (
            F.when(line_ok, column)
            if line_ok is not None
            else F.when(valid[name], column)
            if name in valid
            else column
        ).alias(name)
        for name, column in columns.items()
    ]
    return [
        *guarded,
        (F.coalesce(*bad) if bad else F.lit(None).cast(StringType())).alias(NOT_UTF8),
        (F.coalesce(*bad_bytes) if bad else F.lit(None).cast(BinaryType())).alias(NOT_UTF8_BYTES),
    ]


def input_order(frame: DataFrame, order_by: str | None) -> list[Column]:
    """What a key's messages are sorted by, before their place in the input
    (which breaks ties): ``order_by``, or their file's place
    (:data:`FILE_ORDER`, when ``frame`` was read from files).

    A JSON line's ordering column is text (:func:`json_schema`): values that
    read as numbers order by value, after those that do not (which order by
    their text), and a line without the column comes first; its value as a
    double orders any number, and as a decimal tells apart numbers a double
    cannot (as 2^53 and 2^53 + 1).
    """
    if order_by is None:
        return [F.col(c) for c in FILE_ORDER if c in frame.columns]
    if order_by not in frame.columns:
        raise ValueError(f"order column {order_by!r} is not in the input ({frame.columns})")
    if LINE not in frame.columns or not isinstance(frame.schema[order_by].dataType, StringType):
        return [F.col(order_by)]
    quoted = "`" + order_by.replace("`", "``") + "`"
    # try_cast: a text that is no number is null here, whether ANSI mode is on or off.
    return [
        F.expr(f"try_cast({quoted} AS DOUBLE)"),
        F.expr(f"try_cast({quoted} AS DECIMAL(38, 18))"),
        F.col(order_by),
    ]
