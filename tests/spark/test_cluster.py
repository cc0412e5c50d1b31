"""examples/cluster as written, on a ``local-cluster`` master: two executors,
each its own JVM with its own Python workers, started by the PySpark that pip
installed. The package reaches them only as the built wheel that
``--py-files`` ships, its dependencies only as the virtualenv that
``pack_env.sh`` packs and ``--archives`` ships (their Python is that
virtualenv's, which sees no other site-packages), and the demo's exactly-once
check passes over two runs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
from pyspark.sql import SparkSession

from handlers import InMemoryPublisher, Processor
from handlers.examples import shooting_range
from spark_driver.demo import workload
from tests.helpers import rerun_requests_per_key
from tests.spark.test_pipeline import client, outputs

CLUSTER = "local-cluster[2,1,1024]"
GAMES, PER_GAME = 30, 8
ROOT = Path(__file__).resolve().parents[2]
#: Where a local-cluster's workers keep each executor's directory and logs.
WORK = Path(pyspark.__file__).parent / "work"


#: Packed environments, one per set of dependencies, kept between runs.
ENVIRONMENTS = ROOT / "build" / "cluster-env"


@pytest.fixture(scope="module")
def environment() -> Path:
    """The dependencies packed by ``pack_env.sh``: made once for each
    pyproject.toml's dependencies, script and interpreter, then reused."""
    script = ROOT / "examples" / "cluster" / "pack_env.sh"
    base = getattr(sys, "_base_executable", sys.executable)  # the venv's own Python
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    key = json.dumps([project["dependencies"], script.read_text(), base, sys.version])
    archive = ENVIRONMENTS / hashlib.sha256(key.encode()).hexdigest()[:16] / "environment.tar.gz"
    if not archive.exists():
        done = subprocess.run(
            ["bash", str(script)], capture_output=True, text=True, timeout=600,
            env={**os.environ, "PYTHON": base, "OUT": str(archive)},
        )  # fmt: skip
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return archive


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
    spark: SparkSession,
    tmp_path: Path,
    table_name: str,
    new_applications: list[Path],
    environment: Path,
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
        ENVIRONMENT=str(environment),
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
    # from the shipped wheel (not from this checkout, which they cannot see),
    # on the Python of the environment it unpacked in its own directory.
    apps = sorted(set(WORK.iterdir()) - before)
    new_applications.extend(apps)
    assert len(apps) == 2
    for app in apps:
        executors = {e.name: e for e in app.iterdir() if e.is_dir()}
        assert sorted(executors) == ["0", "1"]
        workers = set()
        for executor in executors.values():
            text = (executor / "stderr").read_text()
            # The executors run the default transport, the wire runner.
            pattern = (
                rf"worker (\d+): wire table client for '{table_name}' "
                r"\(spark_driver at (\S+), Python at (\S+)\)"
            )
            found = re.findall(pattern, text)
            assert found, text[-2000:]
            for _, at, python in found:
                assert at.endswith("/streamstone_py.zip/spark_driver/_tasks/_worker.py"), at
                assert not at.startswith(str(ROOT)), at
                assert os.path.normpath(python) == str(executor / "environment"), python
            workers |= {pid for pid, _, _ in found}
        assert len(workers) >= 2

    # The demo's exactly-once check.
    first, second = summaries
    assert (first["processed"], first["duplicates"]) == (distinct, rows - distinct)
    assert (second["processed"], second["duplicates"], second["new_outputs"]) == (0, rows, 0)
    # As docs/spark-pipeline.md says a rerun costs: about N per key (within a fifth).
    about = rerun_requests_per_key() * GAMES
    assert 0.8 * about <= second["requests"] <= 1.2 * about
    assert first["new_outputs"] == second["reemitted_outputs"] == GAMES * (PER_GAME - 1)
    for summary in summaries:
        assert summary["dead_lettered"] == summary["abandoned"] == summary["faulted"] == 0
    processor = Processor(shooting_range, client(table_name), InMemoryPublisher())
    versions = [processor.current_state(f"game-{g:04d}").version for g in range(GAMES)]
    assert versions == [PER_GAME] * GAMES
    produced = outputs(spark, str(tmp_path / "run1"))
    assert len(produced) == GAMES * (PER_GAME - 1)
    assert outputs(spark, str(tmp_path / "run2")) == produced
