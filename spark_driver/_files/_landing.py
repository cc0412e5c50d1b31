"""The input files the job looks at itself, before Spark reads them, where
Spark would fail on them, leave one out without a word, or run out of memory:

- *names*: a name that is not valid UTF-8 is one Spark's JVM cannot
  represent, so its listing of the folder leaves the file out; so does a
  name the JVM's file-name encoding cannot write. On the local file system a
  name with ``:`` cannot be opened (Hadoop makes the name of the file's
  checksum file from it, which is no valid path). Each is told by name;
- *long lines*: Spark reads a line whole into memory, and one of hundreds of
  MiB ends the JVM. Lines are read up to :data:`MAX_LINE` bytes (Hadoop's
  line reader skips a longer one without holding it); a local file is read
  here first to tell which lines are longer, by number;
- *Parquet columns*: Spark reads a Parquet file without a column of the
  stream's schema as nulls; a file without the message columns, or a column
  the options name, is told instead.
"""

from __future__ import annotations

import bz2
import gzip
import os
import re
from collections.abc import Callable
from typing import Any, Final
from urllib.parse import quote, unquote

from pyspark.sql import DataFrame, SparkSession

from .._input import MAX_LINE
from .._tasks._executor import OUTCOME, RESULT_SCHEMA, result_row
from ._fs import local, qualified, shown, skipped

__all__ = [
    "colon_in_name", "dead_letters", "lacks_columns", "left_out", "long_lines", "misnamed",
]  # fmt: skip

#: The compressions Hadoop reads by a file's suffix (those read here too: .gz, .bz2).
_CODECS: Final = (".gz", ".bz2", ".deflate", ".snappy", ".lz4", ".zst")
_LINE_END: Final = re.compile(rb"\r\n|\r|\n")
_BOM: Final = b"\xef\xbb\xbf"
_CHUNK: Final = 1 << 20


def colon_in_name(uri: str) -> str | None:
    """Why a local file whose name holds ``:`` is not read, or None."""
    if not uri.startswith("file:") or ":" not in unquote(uri.rsplit("/", 1)[-1]):
        return None
    return (
        "its name holds ':', and Hadoop's local file system names the file's checksum file "
        "after it, which such a name makes no valid path (rename it)"
    )


def long_lines(path: bytes) -> str | None:
    """Which lines of the local file ``path`` (plain, or compressed as .gz or
    .bz2) are longer than :data:`MAX_LINE`, and so left out; None if none.
    A plain file no longer than that holds none, and is not read."""
    suffix = os.path.splitext(path)[1].decode("utf-8", "replace")  # as Hadoop: case counts
    if suffix not in (".gz", ".bz2") and (suffix in _CODECS or os.stat(path).st_size <= MAX_LINE):
        return None
    with open(path, "rb") as raw:
        if suffix == ".gz":
            with gzip.GzipFile(fileobj=raw) as unzipped:
                found = _lines_over(unzipped.read)
        elif suffix == ".bz2":
            with bz2.BZ2File(raw) as unzipped:
                found = _lines_over(unzipped.read)
        else:
            found = _lines_over(raw.read)
    if found is None:
        return None
    number, length, more = found
    also = f" (and {more} more such lines)" if more else ""
    return (
        f"line {number} is {length} bytes long, over the {MAX_LINE} bytes (8 MiB) a line may "
        f"hold: it is left out{also}, and the file's other lines are read"
    )


def _lines_over(read: Callable[[int], bytes]) -> tuple[int, int, int] | None:
    """The first line longer than MAX_LINE (its number and length, without
    its end of line) and how many more there are, as Hadoop's line reader
    cuts lines: at ``\\n``, ``\\r\\n`` or ``\\r``, a byte-order mark left out."""
    first: tuple[int, int] | None = None
    more = 0
    number, length, carry, start = 1, 0, b"", True
    while chunk := read(_CHUNK):
        data = carry + chunk
        # A "\r" last may be the first half of "\r\n": it waits for the next read.
        carry = b"\r" if data.endswith(b"\r") else b""
        data = data[: len(data) - len(carry)]
        if start:
            data, start = data.removeprefix(_BOM), False
        *ended, rest = _LINE_END.split(data)
        for part in ended:
            length += len(part)
            if length > MAX_LINE:
                if first is None:
                    first = (number, length)
                else:
                    more += 1
            number, length = number + 1, 0
        length += len(rest)
    if length > MAX_LINE:  # the last line, with or without its end
        if first is None:
            first = (number, length)
        else:
            more += 1
    return None if first is None else (*first, more)


def lacks_columns(spark: SparkSession, uri: str, columns: list[str]) -> str | None:
    """Why a Parquet file is not read for want of ``columns``, by its footer;
    None when it has them, or when it cannot be read as Parquet (Spark's read
    tells why)."""
    jvm: Any = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    try:
        path = jvm.org.apache.hadoop.fs.Path(jvm.java.net.URI(uri))
        file = jvm.org.apache.parquet.hadoop.util.HadoopInputFile.fromPath(path, conf)
        reader = jvm.org.apache.parquet.hadoop.ParquetFileReader.open(file)
        try:
            schema = reader.getFooter().getFileMetaData().getSchema()
        finally:
            reader.close()
        names = [str(schema.getFields().get(n).getName()) for n in range(schema.getFieldCount())]
    except Exception:  # not Parquet, or gone: Spark's read of it tells why
        return None
    missing = [column for column in columns if column not in names]
    if not missing:
        return None
    return f"the file lacks the columns {missing} (its columns: {names})"


def misnamed(spark: SparkSession, directory: str, listed: set[str]) -> list[tuple[str, str]]:
    """The files directly in the local ``directory`` that Spark's listing
    leaves out for their names, each as ``(its URI, why)``. ``listed`` holds
    the names found listed already, and grows (each is asked once)."""
    folder = local(directory)
    if folder is None or not os.path.isdir(folder):
        return []
    jvm: Any = spark.sparkContext._jvm
    found = []
    for entry in os.scandir(folder):
        name = entry.name
        if skipped(name.decode("latin-1")) or not entry.is_file():
            continue
        try:
            text = name.decode("utf-8")
        except UnicodeDecodeError:
            why = "its name is not valid UTF-8, which Spark's JVM cannot represent"
        else:
            if text.isascii() or text in listed:
                continue
            # A name the JVM's file-name encoding cannot write is a file it cannot find.
            if jvm.java.io.File(os.fsdecode(folder), text).exists():
                listed.add(text)
                continue
            why = "its name cannot be written in the JVM's file-name encoding"
        uri = f"file:{quote(os.path.join(folder, name))}"
        found.append((uri, f"Spark's listing of the folder leaves the file out: {why} (rename it)"))
    return sorted(found)


def left_out(spark: SparkSession, path: str) -> list[tuple[str, str, bool]]:
    """What a batch run over the local JSON lines at ``path`` (a file, or the
    files directly in a folder) does not read, each as ``(its URI as Spark's
    file metadata names it; why; whether the whole file)``. The folder is
    listed here: only the files found are named through the JVM."""
    where = local(path)
    if where is None or not os.path.exists(where):
        return []
    folder = os.path.isdir(where)
    files = [where] if not folder else [
        entry.path for entry in os.scandir(where)
        if entry.is_file() and not skipped(entry.name.decode("latin-1"))
    ]  # fmt: skip
    found = []
    for file in files:
        colon = b":" in os.path.basename(file)
        try:
            lines = None if colon else long_lines(file)
        except Exception:  # a file that cannot be read: Spark's read tells why
            lines = None
        if colon or lines is not None:
            try:
                uri = qualified(spark, os.fsdecode(file))
            except UnicodeDecodeError:
                continue  # a name that is not UTF-8: misnamed() tells it
            reason = f"the file cannot be read as JSON lines: {colon_in_name(uri)}"
            found.append((uri, reason, True) if colon else (uri, str(lines), False))
    if folder:
        found += [(uri, why, True) for uri, why in misnamed(spark, path, set())]
    return found


def dead_letters(spark: SparkSession, files: list[tuple[str, str]]) -> DataFrame:
    """A dead letter for each of ``files``, given as ``(URI, why)``: the
    file's path as the raw input, to fix and send again."""
    rows = [result_row(OUTCOME, status="dead_lettered", reason=reason, body=shown(spark, uri))
            for uri, reason in files]  # fmt: skip
    return spark.createDataFrame(rows, RESULT_SCHEMA)
