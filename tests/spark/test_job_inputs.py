"""Where data enters the job, in every input format and both modes: text that is
not UTF-8, bodies nested too deep, lines that are not JSON, and the order in
which a key's messages apply when files land together. Each bad record is
dead-lettered with its reason, alone; every other message is processed."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from handlers import MAX_NESTING, InMemoryPublisher, Processor
from spark_driver import JobSettings, Summary, run_batch, run_stream
from tests.spark.test_pipeline import client
from tests.test_handlers_holes import tally

TALLY = "tests.test_handlers_holes:tally"
MODES = [(f, m) for f in ("json", "parquet") for m in ("batch", "stream")]


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def write_input(directory: Path, rows: list[dict[str, bytes | None]], fmt: str) -> None:
    """Rows of raw bytes as one file: JSON lines (a row's ``line`` as it is), or
    Parquet whose string columns hold the bytes as they are, UTF-8 or not."""
    directory.mkdir(parents=True, exist_ok=True)
    if fmt == "json":
        with (directory / "part-0.jsonl").open("wb") as out:
            for row in rows:
                out.write((row.get("line") or _line(row)) + b"\n")
        return
    rows = [r for r in rows if "line" not in r]
    columns = {
        name: pa.array([r[name] for r in rows], pa.binary()).view(pa.string())
        for name in ("message_id", "key", "type", "body")
    }
    pq.write_table(pa.table(columns), directory / "part-0.parquet")


def _line(row: dict[str, bytes | None]) -> bytes:
    """A JSON line of the row: its text escaped as JSON, its bytes that are not
    UTF-8 left in as they are; the body's JSON written as JSON (not as a
    string), as producers do: the job keeps its raw text."""

    def text(value: bytes | None) -> bytes:
        if value is None:
            return b"null"
        decoded = value.decode("utf-8", "surrogateescape")
        return json.dumps(decoded, ensure_ascii=False).encode("utf-8", "surrogateescape")

    fields = [b'"%s":%s' % (k.encode(), text(v)) for k, v in row.items() if k != "body"]
    body = row.get("body")
    fields.append(b'"body":' + (body if body is not None else b"null"))
    return b"{" + b",".join(fields) + b"}"


def run(
    spark: SparkSession, tmp: Path, table: str, fmt: str, mode: str, inbox: Path
) -> tuple[Summary, Path]:
    settings = JobSettings(table=table, handler=TALLY)
    out = tmp / f"out-{uuid.uuid4().hex[:6]}"
    if mode == "batch":
        summary = run_batch(spark, str(inbox), str(out), settings, input_format=fmt)
        return summary, out
    batches = run_stream(
        spark, str(inbox), str(out), str(tmp / f"cp-{out.name}"), settings, input_format=fmt
    )
    assert [batch for batch, _ in batches] == [0]
    return batches[0][1], out / "batch=0"


def outcome_rows(spark: SparkSession, out: Path) -> dict[str, tuple[str, str | None]]:
    found = spark.read.parquet(str(out / "outcomes")).collect()
    rows = {r.message_id or f"<{r.raw}>": (r.status, r.reason) for r in found}
    assert len(rows) == len(found), "two outcomes were given one id"
    return rows


# --- every kind of bad record, each format, each mode ---------------------------------


@pytest.mark.parametrize(("fmt", "mode"), MODES)
def test_each_bad_record_is_dead_lettered_alone(
    spark: SparkSession, tmp_path: Path, table_name: str, fmt: str, mode: str
) -> None:
    client(table_name)
    add = {"type": b"Add", "body": b"{}"}
    rows: list[dict[str, bytes | None]] = [
        {"message_id": b"m-1", "key": b"k", **add},
        {"message_id": b"m-\xff", "key": b"k", **add},  # two ids Spark would both read as
        {"message_id": b"m-\xfe", "key": b"k", **add},  # 'm-\ufffd'
        {"message_id": b"m-2", "key": b"k\xff", **add},
        {"message_id": b"m-3", "key": b"k\xfe", **add},
        {"message_id": b"m-deep", "key": b"k", "type": b"Add", "body": nested(5000).encode()},
        {"message_id": b"m-257", "key": b"k", "type": b"Add", "body": nested(257).encode()},
        {"message_id": b"m-256", "key": b"k", "type": b"Add", "body": nested(256).encode()},
        {"message_id": b"m-4", "key": b"k", **add},
        {"message_id": b"i" * 505, "key": b"k", **add},  # too long behind 'Tally|SS-UID-'
        {"line": b"\xff\xfe not even json"},
        {"line": b"[1, 2]"},
    ]
    inbox = tmp_path / "inbox"
    write_input(inbox, rows, fmt)

    summary, out = run(spark, tmp_path, table_name, fmt, mode, inbox)

    found = outcome_rows(spark, out)
    deep = f"body nests arrays and objects deeper than {MAX_NESTING} levels"
    expected: dict[str, tuple[str, str | None]] = {
        "m-1": ("completed", None),
        "m-256": ("completed", None),
        "m-4": ("completed", None),
        "m-deep": ("dead_lettered", deep),
        "m-257": ("dead_lettered", deep),
        "i" * 505: ("dead_lettered", (
            f"message id cannot be stored: event id row key 'Tally|SS-UID-{'i' * 27}'... is "
            "1036 bytes in UTF-16; the limit is 1024"
        )),
    }  # fmt: skip
    if fmt == "parquet":
        expected |= {
            "<" + json.dumps(r, sort_keys=True) + ">": ("dead_lettered", reason)
            for r, reason in [
                (_text(rows[1]), "message_id is not valid UTF-8: 'm-\\\\xff'"),
                (_text(rows[2]), "message_id is not valid UTF-8: 'm-\\\\xfe'"),
            ]
        }
        expected |= {
            "m-2": ("dead_lettered", "key is not valid UTF-8: 'k\\\\xff'"),
            "m-3": ("dead_lettered", "key is not valid UTF-8: 'k\\\\xfe'"),
        }
    else:  # a JSON line holding bytes that are not UTF-8 is not text at all
        for row in rows[1:5]:
            line = _line(row).decode("utf-8", "backslashreplace")
            expected[f"<{line}>"] = ("dead_lettered", f"the line is not valid UTF-8: {line!r}")
        expected["<\\xff\\xfe not even json>"] = (
            "dead_lettered",
            "the line is not valid UTF-8: '\\\\xff\\\\xfe not even json'",
        )
        unreadable = (
            "unparseable line: not a JSON object, or one nested too deep for Spark's JSON reader"
        )
        expected["<[1, 2]>"] = ("dead_lettered", unreadable)
        # Spark's JSON reader refuses the deepest body itself: the whole line goes.
        del expected["m-deep"]
        expected[f"<{_line(rows[5]).decode()}>"] = ("dead_lettered", unreadable)
    assert found == expected
    assert (summary.processed, summary.dead_lettered, summary.exit_status) == (
        3,
        len(expected) - 3,
        0,
    )
    state = Processor(tally, client(table_name), InMemoryPublisher()).current_state("k")
    assert (state.version, state.state.seen) == (3, ["m-1", "m-256", "m-4"])


def _text(row: dict[str, bytes | None]) -> dict[str, str | None]:
    """A row as its dead letter's raw input shows it: bytes that are not UTF-8 escaped."""
    return {k: None if v is None else v.decode("utf-8", "backslashreplace") for k, v in row.items()}


def test_a_stream_goes_on_after_a_file_with_a_bad_line(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    client(table_name)
    inbox = tmp_path / "inbox"
    write_input(inbox, [{"message_id": b"a-1", "key": b"k", "type": b"Add", "body": b"{}"},
                        {"line": b'{"message_id":"a-\xff","key":"k","type":"Add","body":{}}'}],
                "json")  # fmt: skip
    settings = JobSettings(table=table_name, handler=TALLY)
    args = (spark, str(inbox), str(tmp_path / "out"), str(tmp_path / "cp"), settings)

    first = run_stream(*args)
    (inbox / "part-1.jsonl").write_bytes(b'{"message_id":"a-2","key":"k","type":"Add"}\n')
    second = run_stream(*args)  # a restart: the bad line is not replayed

    assert [(b, s.processed, s.dead_lettered) for b, s in first] == [(0, 1, 1)]
    assert [(b, s.processed, s.dead_lettered) for b, s in second] == [(1, 1, 0)]


# --- the order of files that land together ---------------------------------------------


def test_a_keys_messages_apply_in_the_order_of_their_files_however_they_are_batched(
    spark: SparkSession, tmp_path: Path
) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    # The older file is the smaller one: Spark fills partitions largest first.
    older, newer = inbox / "z-round.jsonl", inbox / "a-shots.jsonl"
    older.write_text(json.dumps({"message_id": "r", "key": "g", "type": "Add"}) + "\n")
    shots = [json.dumps({"message_id": f"s{n:02d}", "key": "g", "type": "Add"}) for n in range(60)]
    newer.write_text("\n".join(shots) + "\n")
    now = time.time()
    os.utime(older, (now - 120, now - 120))
    os.utime(newer, (now - 60, now - 60))
    expected = ["r", *(f"s{n:02d}" for n in range(60))]

    seen = {}
    for how in ("together", "one file each", "batch"):
        table = "order" + uuid.uuid4().hex[:10]
        client(table)
        settings = JobSettings(table=table, handler=TALLY)
        out = str(tmp_path / table)
        if how == "batch":
            run_batch(spark, str(inbox), out, settings, partitions=2)
        else:
            each = 1 if how == "one file each" else None
            run_stream(spark, str(inbox), out, out + "-cp", settings, partitions=2,
                       max_files_per_trigger=each)  # fmt: skip
        state = Processor(tally, client(table), InMemoryPublisher()).current_state("g")
        seen[how] = state.state.seen
    assert seen == dict.fromkeys(seen, expected)


# --- hostile records drawn at random ----------------------------------------------------

_valid_text = st.text(
    st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/\\#?|"),
    min_size=1,
    max_size=8,
)
_bad_bytes = st.sampled_from([b"\xff", b"\xfe\xfe", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"])


@st.composite
def _corpus(draw: st.DrawFn) -> list[tuple[str, dict[str, bytes | None]]]:
    """Rows, each tagged with what must become of it: "ok" or "dead"."""
    rows: list[tuple[str, dict[str, bytes | None]]] = []
    for n in range(draw(st.integers(4, 14))):
        key = draw(st.sampled_from(["k1", "k2", "k3"])).encode()
        message_id = f"m{n}-".encode() + draw(_valid_text).encode()
        depth = draw(st.sampled_from([0, 1, MAX_NESTING - 1, MAX_NESTING]))
        row: dict[str, bytes | None] = {
            "message_id": message_id, "key": key, "type": b"Add",
            "body": nested(depth).encode() if depth else b"{}",
        }  # fmt: skip
        kind = draw(st.sampled_from(["ok", "ok", "ok", "id", "key", "deep"]))
        if kind == "id":
            row["message_id"] = message_id + draw(_bad_bytes)
        elif kind == "key":
            row["key"] = key + draw(_bad_bytes)
        elif kind == "deep":
            row["body"] = nested(draw(st.sampled_from([MAX_NESTING + 1, 3000]))).encode()
        rows.append(("ok" if kind == "ok" else "dead", row))
    return rows


@pytest.mark.parametrize(("fmt", "mode"), MODES)
@settings(
    max_examples=2,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    # Each example is a Spark job: a failure is reported as drawn, not shrunk.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(corpus=_corpus())
def test_hostile_records_never_merge_nor_touch_another_message(
    spark: SparkSession,
    tmp_path: Path,
    fmt: str,
    mode: str,
    corpus: list[tuple[str, dict[str, bytes | None]]],
) -> None:
    table = "hostile" + uuid.uuid4().hex[:10]
    client(table)
    inbox = tmp_path / f"in-{uuid.uuid4().hex[:6]}"
    write_input(inbox, [row for _, row in corpus], fmt)

    summary, out = run(spark, tmp_path, table, fmt, mode, inbox)

    outcomes = spark.read.parquet(str(out / "outcomes")).collect()
    assert summary.messages_in == len(outcomes) == len(corpus)  # one outcome each, no merge
    good = [row for fate, row in corpus if fate == "ok"]
    assert sorted(o.status for o in outcomes) == sorted(
        ["completed"] * len(good) + ["dead_lettered"] * (len(corpus) - len(good))
    )
    assert all(o.reason for o in outcomes if o.status == "dead_lettered")
    reader = Processor(tally, client(table), InMemoryPublisher())
    for key in ("k1", "k2", "k3"):
        ids = [(row["message_id"] or b"").decode() for row in good if row["key"] == key.encode()]
        assert reader.current_state(key).state.seen == ids
