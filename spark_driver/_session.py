"""The Spark session the pipeline runs in: the master a launcher chose, this
interpreter for local workers, and Spark's log level from the JVM's first line."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from ._settings import LOCAL_MASTER, SPARK_LOG_LEVELS
from ._tasks import _telemetry

__all__ = ["launched_with_master", "session"]


def launched_with_master() -> bool:
    """Whether a launcher already chose the master: this driver runs under
    ``spark-submit`` (which always sets one), or ``PYSPARK_SUBMIT_ARGS`` names one."""
    if os.environ.get("PYSPARK_GATEWAY_PORT"):
        return True
    return "--master" in os.environ.get("PYSPARK_SUBMIT_ARGS", "").split()


_LOG4J2 = Path(__file__).with_name("log4j2.properties")


def session(
    master: str | None = None,
    app: str = "streamstone-py",
    *,
    spark_log_level: str = "ERROR",
    **conf: str,
) -> SparkSession:
    """A Spark session; in local mode its Python workers run this interpreter (this venv).

    ``master=None`` keeps the master a launcher set (``spark-submit --master``,
    or ``--master`` in ``PYSPARK_SUBMIT_ARGS``) and is ``local[2]`` when none
    is set. On a cluster the executors' Python is the cluster's to set
    (PYSPARK_PYTHON or spark.pyspark.python): a driver's local path would not
    exist there.

    ``spark_log_level`` is Spark's own level. When this call starts the JVM,
    it applies from the JVM's first line, so Spark's start-up warnings stay
    quiet at the default ``"ERROR"``; under ``spark-submit`` the JVM is up
    already, and the level applies from here on. A caller's own
    ``spark.driver.extraJavaOptions`` replaces that logging file.
    """
    if spark_log_level not in SPARK_LOG_LEVELS:
        raise ValueError(
            f"spark_log_level must be one of {', '.join(SPARK_LOG_LEVELS)}, got {spark_log_level!r}"
        )
    # The driver's OpenTelemetry SDK, from its OTEL_* variables (the
    # executors' Python workers set up theirs from their own, at each task).
    _telemetry.configure()
    if master is None and not launched_with_master():
        master = LOCAL_MASTER
    if master is not None and master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app)
    if master is not None:
        builder = builder.master(master)
    defaults = {
        "spark.ui.enabled": "false",
        # A progress bar redrawn on a terminal; in a log file it is one long joined line.
        "spark.ui.showConsoleProgress": "true" if sys.stderr.isatty() else "false",
        "spark.sql.shuffle.partitions": "8",
        "spark.sql.session.timeZone": "UTC",
    }
    # Only when this call starts the JVM, and from an installed file (not a
    # zip shipped with --py-files, whose members the JVM cannot open).
    if not os.environ.get("PYSPARK_GATEWAY_PORT") and _LOG4J2.is_file():
        # At the default level a failed task is told once, by the command.
        tasks = "off" if spark_log_level == "ERROR" else spark_log_level.lower()
        defaults["spark.driver.extraJavaOptions"] = (
            f"-Dlog4j2.configurationFile={_LOG4J2.as_uri()} "
            f"-Dspark_driver.log.level={spark_log_level.lower()} "
            f"-Dspark_driver.task.log.level={tasks}"
        )
    for name, value in {**defaults, **conf}.items():
        builder = builder.config(name, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(spark_log_level)
    return spark
