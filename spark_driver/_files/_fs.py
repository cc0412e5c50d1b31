"""The driver's reach into the file system Spark reads and writes (local,
ABFS, ...), through Hadoop's ``FileSystem`` in Spark's JVM: what a path
holds, and the small records the job keeps beside Spark's in a checkpoint."""

from __future__ import annotations

import os
import re
import uuid
from typing import Any
from urllib.parse import unquote_to_bytes

from pyspark.sql import SparkSession

__all__ = [
    "canonical", "create_in_new", "delete", "exists", "glob_escaped", "listed", "local", "names",
    "qualified", "read_text", "shown", "skipped", "write_text",
]  # fmt: skip


def canonical(uri: str) -> str:
    """A file's URI as Spark's file metadata (``_metadata.file_path``) names it:
    Hadoop writes a local file as ``file:/...`` there and ``file:///...`` in a
    checkpoint's source log; other schemes are written alike in both."""
    return "file:/" + uri[len("file:///") :] if uri.startswith("file:///") else uri


def _path(spark: SparkSession, path: str) -> tuple[Any, Any]:
    """The Hadoop file system of ``path``, and the path as Hadoop's ``Path``."""
    jvm: Any = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    return hadoop_path.getFileSystem(conf), hadoop_path


def delete(spark: SparkSession, path: str) -> None:
    """Delete a path, and what is under it."""
    fs, hadoop_path = _path(spark, path)
    fs.delete(hadoop_path, True)


def exists(spark: SparkSession, uri: str) -> bool:
    """Whether the file named by ``uri`` (as Spark's file metadata names it) exists."""
    jvm: Any = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(jvm.java.net.URI(uri))
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    return bool(hadoop_path.getFileSystem(conf).exists(hadoop_path))


def _unchecked(spark: SparkSession, fs: Any) -> Any:
    """The file system under a checksummed one (Hadoop's local file system
    keeps a ``.crc`` beside each file it writes, and refuses to read a file
    edited since): the job's records are read as they are, and a record
    someone edited is told for what it holds."""
    from py4j.java_gateway import is_instance_of  # type: ignore[import-untyped]

    gateway = spark.sparkContext._gateway
    checksummed = is_instance_of(gateway, fs, "org.apache.hadoop.fs.ChecksumFileSystem")
    return fs.getRawFileSystem() if checksummed else fs


def read_text(spark: SparkSession, path: str) -> str | None:
    """A small file's text, or None when there is none."""
    fs, hadoop_path = _path(spark, path)
    fs = _unchecked(spark, fs)
    if not fs.exists(hadoop_path):
        return None
    jvm: Any = spark.sparkContext._jvm
    stream = fs.open(hadoop_path)
    try:
        return bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream)).decode("utf-8")
    finally:
        stream.close()


def write_text(spark: SparkSession, path: str, text: str) -> None:
    """Write a small file whole: beside it first, then renamed over it, so that
    a reader finds the old text or the new one, never a part."""
    fs, hadoop_path = _path(spark, path)
    raw = _unchecked(spark, fs)
    jvm: Any = spark.sparkContext._jvm
    beside = jvm.org.apache.hadoop.fs.Path(hadoop_path.getParent(), f".{uuid.uuid4().hex}.tmp")
    stream = raw.create(beside, True)
    try:
        stream.write(bytearray(text.encode("utf-8")))
    finally:
        stream.close()
    fs.delete(hadoop_path, False)  # with its checksum, if one was kept
    if not raw.rename(beside, hadoop_path):
        raise OSError(f"could not write {path!r}")


def create_in_new(spark: SparkSession, folder: str, name: str) -> Any:
    """An output stream to the file ``name`` in the new ``folder`` (refused,
    naming it, if anything is there), written without a checksum beside it,
    so that the file can be edited by hand and read again."""
    fs, hadoop_path = _path(spark, folder)
    if fs.exists(hadoop_path):
        raise ValueError(f"{folder!r} exists: give a new folder (nothing is written over)")
    jvm: Any = spark.sparkContext._jvm
    return _unchecked(spark, fs).create(jvm.org.apache.hadoop.fs.Path(hadoop_path, name), False)


def listed(spark: SparkSession, directory: str) -> list[tuple[str, int]]:
    """The files directly in ``directory`` that Spark's file source would read
    (not those whose names it skips), each as ``(uri, modification time in
    ms)``, oldest first (then by name), the order in which a stream takes them."""
    fs, hadoop_path = _path(spark, directory)
    if not fs.exists(hadoop_path):
        return []
    found = []
    for status in fs.listStatus(hadoop_path):
        name = status.getPath().getName()
        if status.isFile() and not skipped(name):
            uri = canonical(str(status.getPath().toUri().toString()))
            found.append((uri, int(status.getModificationTime())))
    return sorted(found, key=lambda entry: (entry[1], entry[0]))


def qualified(spark: SparkSession, path: str) -> str:
    """A file's URI as Spark's file metadata names it (``file:/in/a%20b.json``)."""
    fs, hadoop_path = _path(spark, path)
    return canonical(str(fs.makeQualified(hadoop_path).toUri().toString()))


def names(spark: SparkSession, directory: str) -> set[str]:
    """The names of what is directly in ``directory`` (none if it is not there)."""
    fs, hadoop_path = _path(spark, directory)
    if not fs.exists(hadoop_path):
        return set()
    return {str(status.getPath().getName()) for status in fs.listStatus(hadoop_path)}


def skipped(name: str) -> bool:
    """Whether Spark's file listing leaves a file of this name out: a name that
    starts with ``.`` or ``_`` (hidden, or in progress: Spark's own writers
    and Hadoop's use such names), or ends with ``._COPYING_`` (Hadoop's copy
    in progress)."""
    return name.startswith((".", "_")) or name.endswith("._COPYING_")


def local(uri: str) -> bytes | None:
    """A file's path on the local file system, from its URI as Spark names it
    (``file:/a%20b`` or ``file:///a%20b``), or from a path with no scheme;
    None for another file system."""
    if uri.startswith("file:"):
        return unquote_to_bytes(uri[len("file:") :].removeprefix("//"))
    if "://" in uri:
        return None
    return os.fsencode(os.path.abspath(uri))


def shown(spark: SparkSession, uri: str) -> str:
    """A file's URI as a person reads it: its path decoded (``file:/in/a b.json``),
    bytes of a local name that are not UTF-8 escaped (``file:/in/b-\\xff.json``:
    the JVM would show them all as U+FFFD)."""
    path = local(uri) if uri.startswith("file:") else None
    if path is not None:
        try:
            path.decode("utf-8")
        except UnicodeDecodeError:
            return f"file:{path.decode('utf-8', 'backslashreplace')}"
    jvm: Any = spark.sparkContext._jvm
    return str(jvm.org.apache.hadoop.fs.Path(jvm.java.net.URI(uri)).toString())


#: What Hadoop's path globbing reads as a pattern rather than a name.
_GLOB = re.compile(r"([\\*?\[\]{}])")


def glob_escaped(path: str) -> str:
    """``path`` as a reader's argument that names that one file, whatever its
    characters (Spark expands patterns in the paths it is given)."""
    return _GLOB.sub(r"\\\1", path)
