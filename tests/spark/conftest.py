"""One Spark session for all pipeline tests (starting one takes seconds)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def spark(connection_string: str) -> Iterator[SparkSession]:
    # Executors read the account from their environment, and import the test
    # handlers from the repository: both must be set before the JVM starts.
    os.environ["STREAMSTONE_CONNECTION_STRING"] = connection_string
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
    )
    from spark_driver import session

    # local[2,4]: two cores, and a failed task is tried up to four times.
    spark = session(
        "local[2,4]", "streamstone-py tests", **{"spark.ui.showConsoleProgress": "false"}
    )
    spark.sparkContext.setLogLevel("ERROR")
    yield spark
    spark.stop()


@pytest.fixture
def table_name() -> str:
    return "spark" + uuid.uuid4().hex[:12]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    return str(path)


def spread(directory: Path, rows: list[dict[str, Any]], files: int) -> str:
    """The rows dealt round-robin into ``files`` JSON-lines files, a streaming inbox."""
    for n in range(files):
        write_jsonl(directory / f"part-{n:02d}.jsonl", rows[n::files])
    return str(directory)


def game_messages(games: int, shots: int, prefix: str = "game") -> list[dict[str, Any]]:
    rows = []
    for g in range(games):
        key = f"{prefix}-{g:03d}"
        rows.append(
            {"message_id": f"{key}-round", "key": key, "type": "StartNewRound", "body": None}
        )
        for n in range(1, shots + 1):
            body = json.dumps({"position": (g * 7 + n * 13) % 100, "player": f"p{n % 3}"})
            rows.append(
                {"message_id": f"{key}-shot-{n}", "key": key, "type": "FireAt", "body": body}
            )
    return rows


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """PySpark 3.5 leaves the local sockets it reads collected rows from to the
    garbage collector (4.x closes them), which the suite's warnings-as-errors
    would report as this test's fault: on 3.5 only, those warnings are ignored."""
    import pyspark

    if not pyspark.__version__.startswith("3."):
        return
    ignore = pytest.mark.filterwarnings(
        r"ignore:Exception ignored in. <socket\.socket:pytest.PytestUnraisableExceptionWarning"
    )
    for item in items:
        if Path(str(item.path)).is_relative_to(ROOT / "tests" / "spark"):
            item.add_marker(ignore)
