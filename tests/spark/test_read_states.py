"""read_states / read_history: a handler's states as DataFrames, the scan spread
over Spark tasks, and exactly what the processor reads key by key."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from handlers import InMemoryPublisher, Message, Processor
from handlers.examples import leader_board, shooting_range
from spark_driver import read_history, read_states
from spark_driver._states import _ranges
from tests.spark.test_pipeline import client

GAMES = 10


def fill(table: str) -> Processor[Any]:
    """Ten games of ShootingRange, and LeaderBoard streams beside some of them."""
    shots: Processor[Any] = Processor(shooting_range, client(table), InMemoryPublisher())
    board: Processor[Any] = Processor(leader_board, client(table), InMemoryPublisher())
    for g in range(GAMES):
        game = f"game-{g:02d}"
        messages = [Message(f"{game}-r", game, "StartNewRound")]
        messages += [
            Message(f"{game}-{n}", game, "FireAt", {"position": n}) for n in range(g % 4 + 1)
        ]
        shots.process_batch(game, messages)
    board.process(Message("h-1", "game-03", "Hit", {"player": "ann"}))
    board.process(Message("h-2", "zz-board-only", "Missed", {"player": "bob"}))
    shots.retain("game-07", keep_last=1)
    return shots


def test_read_states_is_every_key_s_newest_state_scanned_in_parallel(
    spark: SparkSession, table_name: str
) -> None:
    shots = fill(table_name)

    frame = read_states(spark, table_name, "shooting_range", partitions=3)

    assert frame.columns == ["key", "version", "updated", "state"]
    rows = sorted(frame.collect(), key=lambda r: r.key)
    expected = [shots.current_state(f"game-{g:02d}") for g in range(GAMES)]
    assert [(r.key, r.version, json.loads(r.state)) for r in rows] == [
        (s.key, s.version, {
            "number_of_attempts": s.state.number_of_attempts,
            "rounds": s.state.rounds,
            "target_position": s.state.target_position,
        })
        for s in expected
    ]  # fmt: skip
    assert all(r.updated is not None for r in rows)
    # Three tasks, each scanning a contiguous range of about a third of the keys.
    parts = frame.rdd.glom().map(lambda rows: [r.key for r in rows]).collect()
    assert [len(p) for p in parts] == [3, 3, 4]
    assert [key for part in parts for key in part] == [f"game-{g:02d}" for g in range(GAMES)]
    # The state as a struct, with Spark's own JSON reader.
    structs = spark.read.json(frame.rdd.map(lambda r: r.state))
    assert sorted(structs.columns) == ["number_of_attempts", "rounds", "target_position"]
    assert structs.agg(F.sum("rounds")).first()[0] == GAMES  # type: ignore[index]

    board = read_states(spark, table_name, "leader_board").collect()
    assert sorted((r.key, r.version, r.state) for r in board) == [
        ("game-03", 1, '{"hits":1,"misses":0,"players":{"ann":1}}'),
        ("zz-board-only", 1, '{"hits":0,"misses":1,"players":{}}'),
    ]


def test_read_history_is_every_kept_version_of_the_given_keys(
    spark: SparkSession, table_name: str
) -> None:
    shots = fill(table_name)

    frame = read_history(spark, table_name, "shooting_range", ["game-07", "game-02", "nobody"])

    rows = frame.orderBy("key", "version").collect()
    expected = [
        (key, v.version, v.message_id, v.message_type, v.now, v.state.rounds)
        for key in ("game-02", "game-07")
        for v in shots.history(key)
    ]
    got = [
        (r.key, r.version, r.message_id, r.type, r.time, json.loads(r.state)["rounds"])
        for r in rows
    ]
    assert [g[:4] for g in got] == [e[:4] for e in expected]
    assert [g[5] for g in got] == [e[5] for e in expected]
    # game-07 kept its last version and the one before it; versions 1-3 are gone.
    assert [r.version for r in rows if r.key == "game-07"] == [4, 5]
    assert [r.message_id for r in rows if r.key == "game-02"] == [
        "game-02-r",
        "game-02-0",
        "game-02-1",
        "game-02-2",
    ]


def test_read_states_gives_every_key_once_whatever_its_characters(
    spark: SparkSession, table_name: str
) -> None:
    # Python sorts U+FF01 after U+1F600; the table (UTF-16) sorts it before.
    keys = ["game-a", "game-b\U0001f600", "game-b\uff01", "game-c"]
    shots: Processor[Any] = Processor(shooting_range, client(table_name), InMemoryPublisher())
    for key in keys:
        shots.process(Message(f"{key}-r", key, "StartNewRound"))

    frame = read_states(spark, table_name, "shooting_range", partitions=4)

    assert sorted((r.key, r.version) for r in frame.collect()) == sorted((k, 1) for k in keys)


def test_ranges_cover_the_whole_key_space_and_bad_arguments_are_refused(
    spark: SparkSession, table_name: str
) -> None:
    assert _ranges([], 8) == [(None, None)]
    assert _ranges(["a"], 8) == [(None, None)]
    assert _ranges(["a", "b", "c", "d"], 2) == [(None, "c"), ("c", None)]
    assert _ranges(["a", "a", "a", "b"], 3) == [(None, "a"), ("a", None)]
    with pytest.raises(ValueError, match="partitions must be an int >= 1, got 0"):
        read_states(spark, table_name, "shooting_range", partitions=0)
    with pytest.raises(ValueError, match="handler 'nope' is neither a built-in"):
        read_states(spark, table_name, "nope")
    with pytest.raises(TypeError, match="keys must be a sequence of str, got 'game-01'"):
        read_history(spark, table_name, "shooting_range", "game-01")
