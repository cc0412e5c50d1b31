"""What a file stream's checkpoint tells the driver: the micro-batches Spark
planned and committed, the files its file source took in each (with their
modification times then), and the records the job keeps beside Spark's: the
input's format and schema, the files not read (or not whole), and the files
told as written to after they were taken. A record someone edited or cut
short is refused with one line naming its file and what is wrong."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Final, TypeVar

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from .._checks import INPUT_RECORD
from ._fs import canonical, names, read_text, write_text

__all__ = ["FORMATS", "INPUT", "Checkpoint", "Unreadable"]

T = TypeVar("T")
FORMATS: Final = {"json": "JSON lines", "parquet": "Parquet"}
#: The job's records, in the checkpoint's folder ``INPUT_RECORD[0]``.
INPUT: Final = INPUT_RECORD[1]
_UNREADABLE: Final = "unreadable.json"
_WRITTEN_AFTER: Final = "written-after-taken.json"


@dataclass(frozen=True)
class Unreadable:
    """A file the stream does not read, or not whole: its URI (as Spark's
    file metadata names it), the micro-batch that met it, why, and whether
    the whole file is left out (else only what ``reason`` names)."""

    uri: str
    batch: int
    reason: str
    whole: bool = True


def _entries(value: Any) -> list[Unreadable]:
    kinds = {"uri": str, "batch": int, "reason": str, "whole": bool}
    if not isinstance(value, list):
        raise ValueError(f"a list of files was expected, not {type(value).__name__}")
    for item in value:
        fits = isinstance(item, dict) and {"uri", "batch", "reason"} <= set(item) <= set(kinds)
        if not fits or not all(type(item[k]) is kinds[k] for k in item):
            raise ValueError(
                f"entry {item!r} is not an object of uri (text), batch (a whole number), "
                "reason (text) and, optionally, whole (true or false)"
            )
    return [Unreadable(**item) for item in value]


def _names(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError("a list of file names was expected")
    return value


def _input(value: Any) -> tuple[str, StructType]:
    if not isinstance(value, dict) or set(value) != {"format", "schema"}:
        raise ValueError("an object of format and schema (only) was expected")
    if value["format"] not in FORMATS:
        raise ValueError(f"format {value['format']!r} is neither 'json' nor 'parquet'")
    try:
        schema = StructType.fromJson(value["schema"])
    except Exception as exc:  # whatever Spark's parser makes of an edited schema
        raise ValueError(f"its schema is not Spark's ({type(exc).__name__}: {exc})") from None
    return value["format"], schema


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

    def record(self, name: str, read: Callable[[Any], T]) -> T | None:
        """One of the job's records, as ``read`` makes it of its JSON (raising
        ValueError on what it cannot take), or None before it is first kept.
        A record someone edited or cut short is refused, naming its file."""
        where = self.record_path(name)
        text = read_text(self.spark, where)
        if text is None:
            return None
        try:
            return read(json.loads(text))
        except ValueError as exc:  # JSON's own errors too
            raise ValueError(
                f"checkpoint record {where!r} is damaged: {exc} (the job's own record: put "
                "back what it held, or remove it and the stream records it afresh)"
            ) from None

    def keep(self, name: str, value: Any) -> None:
        write_text(self.spark, self.record_path(name), json.dumps(value, indent=1))

    # --- the job's records ------------------------------------------------------------

    def input(self) -> tuple[str, StructType] | None:
        """The input's format and schema, as the first start recorded them."""
        return self.record(INPUT, _input)

    def keep_input(self, input_format: str, schema: StructType) -> None:
        self.keep(INPUT, {"format": input_format, "schema": schema.jsonValue()})

    def unreadable(self) -> list[Unreadable]:
        return self.record(_UNREADABLE, _entries) or []

    def keep_unreadable(self, entries: list[Unreadable]) -> None:
        self.keep(_UNREADABLE, [asdict(entry) for entry in entries])

    def told(self) -> list[str]:
        """The files told as written to after the stream took them."""
        return self.record(_WRITTEN_AFTER, _names) or []

    def keep_told(self, told: list[str]) -> None:
        self.keep(_WRITTEN_AFTER, told)
