"""OpenTelemetry from the executors: with ``OTEL_*`` in their environment, the
Python workers set up the SDK and export their spans and metrics over
OTLP/HTTP to a receiver on a loopback port; each message's processing span is
a child of the context its envelope carried, and its outputs carry the trace
on, in the output files' ``headers`` and in the envelopes the sink sends."""

from __future__ import annotations

import base64
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from azure.storage.queue import QueueClient
from opentelemetry import trace
from pyspark.sql import SparkSession

from handlers import Message, decode_envelope, encode_envelope
from spark_driver import JobSettings
from spark_driver._queues._sink import OutputRoute
from spark_driver._tasks import _export_health, _telemetry
from spark_driver._tasks._export_health import Health
from tests.helpers import drain
from tests.metrics import install as metrics_installed
from tests.otlp import Received, receiving
from tests.spark.test_pipeline import client
from tests.spark.test_queue_source import needs_pyspark_4, queues, send  # noqa: F401 (fixture)
from tests.tracing import install as tracing_installed


@pytest.fixture
def executors_export(spark: SparkSession) -> Iterator[Received]:
    """OTEL_* in the executors' environment (``spark.executorEnv``, as on a
    cluster) for this test's tasks only: Spark starts Python workers of their
    own for them, and the other tests' workers stay as they were."""
    environment = spark.sparkContext.environment
    kept = dict(environment)
    with receiving() as received:
        environment.update({
            "OTEL_EXPORTER_OTLP_ENDPOINT": received.url,
            "OTEL_SERVICE_NAME": "streamstone-executors",
            # Sent at each task's end; no export of an idle worker's afterwards.
            "OTEL_METRIC_EXPORT_INTERVAL": "3600000",
        })  # fmt: skip
        try:
            yield received
        finally:
            environment.clear()
            environment.update(kept)


def _traced(message: Message) -> tuple[str, int, int]:
    """The message's envelope text, as its sender's span sent it."""
    trace_id, span_id = uuid.uuid4().int >> 1, uuid.uuid4().int >> 65
    headers = {"traceparent": f"00-{trace_id:032x}-{span_id:016x}-01"}
    sent = Message(message.id, message.key, message.type, message.body, headers)
    return base64.b64encode(encode_envelope(sent).encode()).decode(), trace_id, span_id


@needs_pyspark_4
def test_executors_export_spans_parented_on_the_input_messages_and_their_outputs_carry_them(
    spark: SparkSession,
    tmp_path: Path,
    table_name: str,
    queues: Callable[[str], QueueClient],  # noqa: F811 (the fixture)
    executors_export: Received,
) -> None:
    from spark_driver import run_queue

    inbox, out = queues("inbox"), queues("out")
    shots = [Message(f"game-{g}-shot", f"game-{g}", "FireAt", {"position": 0}) for g in "ab"]
    traced = {m.id: _traced(m) for m in shots}
    unknown = Message("game-c-1", "game-c", "Reload")  # dead-lettered
    send(inbox, [t for t, _, _ in traced.values()] + [_traced(unknown)[0]])
    out.create_queue()
    client(table_name)

    run_queue(
        spark, inbox.queue_name, str(tmp_path / "out"), str(tmp_path / "cp"),
        JobSettings(table=table_name, handler="shooting_range"), partitions=2,
        output_queues=OutputRoute.parse([out.queue_name]),
    )  # fmt: skip

    spans = executors_export.spans()
    processed = {s.attributes["messaging.message.id"]: s for s in spans
                 if s.name == "process ShootingRange"}  # fmt: skip
    assert sorted(processed) == sorted(traced)  # the unknown type is refused before
    for message_id, (_, trace_id, sender) in traced.items():
        span = processed[message_id]
        assert (span.trace_id, span.parent_span_id) == (trace_id, sender)
        assert span.attributes["streamstone.outcome"] == "completed"
        assert span.resource["service.name"] == "streamstone-executors"
    writes = [s for s in spans if s.name == f"submit_transaction {table_name}"]
    assert {s.trace_id for s in writes} == {t for _, t, _ in traced.values()}
    # Each output in its source's trace: in the files, and on the queue.
    rows = spark.read.parquet(str(tmp_path / "out/batch=0/outputs")).collect()
    publishes = {s.span_id: s.trace_id for s in spans if s.name == "publish ShootingRange"}
    by_source = {r.source_message_id: r.headers["traceparent"].split("-") for r in rows}
    assert {k: (int(v[1], 16), publishes[int(v[2], 16)]) for k, v in by_source.items()} == {
        k: (t, t) for k, (_, t, _) in traced.items()
    }
    sent = [decode_envelope(base64.b64decode(text).decode()) for text in drain(out)]
    assert sorted(m.headers["traceparent"] for m in sent) == sorted(
        r.headers["traceparent"] for r in rows
    )
    assert executors_export.sums("streamstone.messages", "streamstone.outcome") == {
        "completed": 2,
        "dead_lettered": 1,
    }


# --- the SDK set up in a process, from its environment ---------------------------------


@pytest.fixture
def driver_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """This process as a driver whose environment the test sets; whatever the
    job set up is shut down and taken back after it."""
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr(_telemetry, "_health", Health())
    try:
        yield monkeypatch
    finally:
        for provider in _telemetry._providers:
            provider.shutdown()
        _telemetry._providers.clear()
        tracing_installed(None)
        metrics_installed(None)


def test_the_driver_exports_over_otlp_http_when_otel_variables_are_set(
    driver_env: pytest.MonkeyPatch,
) -> None:
    assert _telemetry.configure() is False  # no OTEL_* variable: nothing done
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    with receiving() as received:
        driver_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", received.url)
        driver_env.setenv("OTEL_SERVICE_NAME", "streamstone-driver")
        driver_env.setenv("OTEL_METRICS_EXPORTER", "none")

        assert _telemetry.configure() is True
        with trace.get_tracer("tests").start_as_current_span("on the driver"):
            pass
        _telemetry.flush()

        [span] = received.spans()
    assert (span.name, span.resource["service.name"]) == ("on the driver", "streamstone-driver")
    assert [path for path, _ in received.bodies] == ["/v1/traces"]  # no metrics: none asked


@pytest.mark.parametrize(
    ("variable", "value", "error"),
    [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", "OTEL_EXPORTER_OTLP_PROTOCOL='grpc': the job "
         "sends OTLP over HTTP only ('http/protobuf')"),
        ("OTEL_TRACES_EXPORTER", "zipkin", "OTEL_TRACES_EXPORTER='zipkin': the job exports with "
         "'otlp' (over HTTP), 'console' or 'none'"),
    ],
)  # fmt: skip
def test_a_setting_the_job_cannot_follow_is_refused_by_name(
    driver_env: pytest.MonkeyPatch, variable: str, value: str, error: str
) -> None:
    driver_env.setenv(variable, value)
    with pytest.raises(ValueError, match=re.escape(error)):
        _telemetry.configure()


def test_the_command_says_which_package_is_missing_when_otel_variables_are_set(
    driver_env: pytest.MonkeyPatch,
    connection_string: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from spark_driver.__main__ import main

    driver_env.setenv("STREAMSTONE_CONNECTION_STRING", connection_string)
    driver_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    # As if the exporter were not installed: importing it fails.
    driver_env.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http", None)
    inbox = tmp_path / "in.jsonl"
    inbox.write_text("")
    with pytest.raises(SystemExit) as done:
        main(["run", "--input", str(inbox), "--output", str(tmp_path / "out"),
              "--table", f"otel{uuid.uuid4().hex[:10]}"])  # fmt: skip

    *_, line = capsys.readouterr().err.splitlines()
    assert done.value.code == 2
    assert line + "\n" == (
        "python -m spark_driver: error: OTEL_EXPORTER_OTLP_ENDPOINT set, but "
        "opentelemetry-exporter-otlp-proto-http is not installed (it cannot import "
        "'opentelemetry.exporter.otlp.proto.http'): install streamstone-py[otel], or unset the "
        "OTEL_ variables\n"
    )


def test_a_collector_that_is_down_costs_a_worker_one_timeout_not_one_per_task(
    driver_env: pytest.MonkeyPatch,
) -> None:
    driver_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")  # nothing listens
    driver_env.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")
    driver_env.setenv("OTEL_METRIC_EXPORT_INTERVAL", "3600000")
    assert _telemetry.configure() is True
    started = time.monotonic()
    for _ in range(2):  # two tasks of one worker, each with its span and outcome
        with trace.get_tracer("tests").start_as_current_span("a task"):
            _telemetry.counted(["completed"], **{"streamstone.handler": "Tally"})
        _telemetry.flush()
    assert time.monotonic() - started < 2 + 1
    # A quiet period, not for good: once it is over, a task's end waits again.
    driver_env.setattr(_export_health, "QUIET_SECONDS", 0.0)
    with trace.get_tracer("tests").start_as_current_span("a task"):
        pass
    started = time.monotonic()
    _telemetry.flush()
    assert time.monotonic() - started > 0.5  # it tried the collector again
