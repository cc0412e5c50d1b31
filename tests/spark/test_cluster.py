"""examples/cluster as written, on a ``local-cluster`` master: two executors,
each its own JVM with its own Python workers, started by the PySpark that pip
installed. The package reaches them only as the built wheel that
``--py-files`` ships, and the demo's exactly-once check passes over two runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
from pyspark.sql import SparkSession

from handlers import InMemoryPublisher, Processor
from handlers.examples import shooting_range
from spark_driver.demo import workload
from tests.spark.test_pipeline import client, outputs

CLUSTER = "local-cluster[2,1,1024]"
GAMES, PER_GAME = 30, 8
ROOT = Path(__file__).resolve().parents[2]
#: Where a local-cluster's workers keep each executor's directory and logs.
WORK = Path(pyspark.__file__).parent / "work"


@pytest.fixture
def new_applications() -> Iterator[list[Path]]:
    """The application directories the test's runs add to the workers' work
    directory (removed afterwards: it lies inside the PySpark installation)."""
    before = set(WORK.iterdir()) if WORK.exists() else set()
    added: list[Path] = []
    yield added
    for path in set(WORK.iterdir()) - before if WORK.exists() else ():
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.cluster
def test_submit_sh_on_a_local_cluster_passes_the_exactly_once_check(
    spark: SparkSession, tmp_path: Path, table_name: str, new_applications: list[Path]
) -> None:
    distinct, rows = workload(tmp_path / "messages.jsonl", GAMES, PER_GAME)
    before = set(WORK.iterdir()) if WORK.exists() else set()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "VIRTUAL_ENV"))}
    # Tests put the repository on PYTHONPATH; a cluster's Python does not have it.
    env.pop("PYTHONPATH", None)
    env.update(
        SPARK_MASTER=CLUSTER,
        INPUT=str(tmp_path / "messages.jsonl"),
        INPUT_FORMAT="json",
        TABLE=table_name,
        PARTITIONS="4",
        PYTHON=sys.executable,
        DIST=str(tmp_path / "dist"),
        EXECUTOR_ENV="STREAMSTONE_CONNECTION_STRING",
    )
    summaries = []
    for run in (1, 2):
        out = tmp_path / f"run{run}"
        command = ["bash", str(ROOT / "examples" / "cluster" / "submit.sh"), "--log-level", "INFO"]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=400, env={**env, "OUTPUT": str(out)}
        )
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        assert f"spark master: {CLUSTER}\n" in done.stdout + done.stderr
        [line] = (out / "summary").glob("part-*.json")
        summaries.append(json.loads(line.read_text()))

    # Two executors per run, separate processes, each importing spark_driver
    # from the shipped wheel (not from this checkout, which they cannot see).
    apps = sorted(set(WORK.iterdir()) - before)
    new_applications.extend(apps)
    assert len(apps) == 2
    for app in apps:
        logs = {e.name: (e / "stderr").read_text() for e in app.iterdir() if e.is_dir()}
        assert sorted(logs) == ["0", "1"]
        workers = set()
        for text in logs.values():
            # The executors run the default transport, the wire runner.
            pattern = (
                rf"worker (\d+): wire table client for '{table_name}' \(spark_driver at (\S+)\)"
            )
            found = re.findall(pattern, text)
            assert found, text[-2000:]
            for _, at in found:
                assert at.endswith("/streamstone_py.zip/spark_driver/_tasks/_worker.py"), at
                assert not at.startswith(str(ROOT)), at
            workers |= {pid for pid, _ in found}
        assert len(workers) >= 2

    # The demo's exactly-once check.
    first, second = summaries
    assert (first["processed"], first["duplicates"]) == (distinct, rows - distinct)
    assert (second["processed"], second["duplicates"], second["new_outputs"]) == (0, rows, 0)
    assert first["new_outputs"] == second["reemitted_outputs"] == GAMES * (PER_GAME - 1)
    for summary in summaries:
        assert summary["dead_lettered"] == summary["abandoned"] == summary["faulted"] == 0
    processor = Processor(shooting_range, client(table_name), InMemoryPublisher())
    versions = [processor.current_state(f"game-{g:04d}").version for g in range(GAMES)]
    assert versions == [PER_GAME] * GAMES
    produced = outputs(spark, str(tmp_path / "run1"))
    assert len(produced) == GAMES * (PER_GAME - 1)
    assert outputs(spark, str(tmp_path / "run2")) == produced
