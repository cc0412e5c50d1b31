"""``python -m spark_driver run ...`` and ``python -m spark_driver demo``.

Exit statuses, each with one line on stderr that says why (see
docs/spark-pipeline.md, "Exit statuses"):

- 0: every message is completed, a duplicate or dead-lettered;
- 2 (``REFUSED_EXIT``): refused before any work: a bad option, missing
  credentials, a missing table or input, an output path that is a file;
- 3 (``UNSETTLED_EXIT``): some messages are abandoned or faulted, so a
  scheduler delivers the input again (the summary lists the first of them);
- 4 (``FAILED_EXIT``): the job stopped: ``--fail-fast`` met an abandoned or
  faulted message, or Spark failed, or Spark's JVM ended (out of memory,
  killed);
- 130: interrupted (Ctrl-C).

With ``--trigger`` a stream runs until SIGTERM or Ctrl-C, which let the
micro-batch in progress finish; the statuses are then those above (a second
Ctrl-C interrupts: 130).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any, Final

from ._checks import (
    Refused,
    check_input,
    check_queue,
    check_table,
    check_writable_dir,
    note_replaced_output,
    spark_failure,
)
from ._options import Parser, build_parser
from ._settings import BUILTIN_HANDLERS, LOCAL_MASTER

#: A job that stopped: ``--fail-fast`` met an unsettled message, or Spark failed.
FAILED_EXIT: Final = 4
#: A command refused before any work.
REFUSED_EXIT: Final = 2
#: Interrupted (Ctrl-C), as shells report a SIGINT.
INTERRUPTED_EXIT: Final = 130


def _workers_import_from(spec: str) -> None:
    """Local Python workers find the handler's module where this process found
    it: ``python -m`` put the working directory on this process's path only."""
    module_name = BUILTIN_HANDLERS.get(spec, spec).partition(":")[0]
    file = getattr(sys.modules.get(module_name), "__file__", None)
    if not file:
        return
    depth = module_name.count(".") + (os.path.basename(file) == "__init__.py")
    root = os.path.dirname(os.path.abspath(file))
    for _ in range(depth):
        root = os.path.dirname(root)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    if args.command == "demo":
        from .demo import main as demo

        return demo(args.strategy)

    from ._logs import configure as configure_logging
    from ._session import launched_with_master, session
    from ._settings import JobSettings, parse_duration, resolve_handler

    if args.partitions < 1:
        parser.error(f"--partitions must be >= 1, got {args.partitions}")
    if args.concurrency < 1:
        parser.error(f"--concurrency must be >= 1, got {args.concurrency}")
    if args.stream and not args.checkpoint:
        parser.error("--stream needs --checkpoint")
    _queue_options(parser, args)
    if args.max_files_per_trigger is not None:
        if not args.stream or args.queue is not None:
            parser.error("--max-files-per-trigger needs --stream (a file stream)")
        if args.max_files_per_trigger < 1:
            parser.error(f"--max-files-per-trigger must be >= 1, got {args.max_files_per_trigger}")
    if args.keep_last is not None and args.keep_last < 0:
        parser.error(f"--keep-last must be >= 0, got {args.keep_last}")
    if args.retain_at_least < 1:
        parser.error(f"--retain-at-least must be >= 1, got {args.retain_at_least}")
    if args.retain_at_least > 1 and args.keep_last is None and args.retain_for is None:
        parser.error("--retain-at-least needs --keep-last or --retain-for")
    retain_for = None
    if args.retain_for is not None:
        try:
            retain_for = parse_duration(args.retain_for)
        except ValueError as exc:
            parser.error(f"--retain-for: {exc}")
    if args.tokens and args.strategy != "state":
        parser.error(f"--tokens needs --strategy state, got {args.strategy!r}")
    try:
        found = resolve_handler(args.handler)
    except ValueError as exc:
        parser.error(str(exc))
    if args.tokens and found.message_types is None:
        parser.error(
            f"--tokens needs handler {args.handler!r} to name its types (@handler(..., "
            "types=[...])): an output of a type it takes is what carries a token"
        )
    if (args.master or ("" if launched_with_master() else LOCAL_MASTER)).startswith("local"):
        _workers_import_from(args.handler)
    configure_logging(args.log_level)
    if args.account_url:
        os.environ["STREAMSTONE_ACCOUNT_URL"] = args.account_url
    try:
        if args.queue is None:
            check_input(args.input, args.input_format, args.checkpoint if args.stream else None)
        check_writable_dir("--output", args.output)
        check_writable_dir("--checkpoint", args.checkpoint)
        check_table(args.table, create=not args.no_create_table)
        for option, queue in args.queues_used:
            check_queue(option, queue)
        note_replaced_output(args.output, args.stream or args.queue is not None)
    except Refused as exc:
        parser.exit(REFUSED_EXIT, f"{parser.prog}: error: {exc}\n")
    settings = JobSettings(
        table=args.table,
        handler=args.handler,
        strategy=args.strategy,
        fail_fast=args.fail_fast,
        log_level=args.log_level,
        concurrency=args.concurrency,
        keep_last=args.keep_last,
        retain_for=retain_for,
        retain_at_least=args.retain_at_least,
        compression=args.compression,
        sent_at=args.sent_at,
        transport=args.transport,
        trace_context=args.trace_context,
        tokens=args.tokens,
    )
    try:
        spark = session(args.master, spark_log_level=args.spark_log_level)
    except (ImportError, ValueError) as exc:  # OTEL_* set without the SDK, or set wrong
        parser.exit(REFUSED_EXIT, f"{parser.prog}: error: {exc}\n")
    print(f"spark master: {spark.sparkContext.master}", file=sys.stderr)
    status, line, lost = 0, None, None
    interrupted = threading.Event()
    try:
        with _ctrl_c_sets(interrupted):
            status = _run(spark, args, settings)
    except ValueError as exc:  # bad input found once Spark read it (e.g. the order column)
        status, line = REFUSED_EXIT, f"error: {exc}"
    except Exception as exc:  # Spark's failure, or --fail-fast's stop: one line, status 4
        logging.getLogger("spark_driver").debug("the job failed", exc_info=True)
        lost = _jvm_lost(exc)
        status, line = FAILED_EXIT, f"error: {lost or spark_failure(exc)}"
    except KeyboardInterrupt:
        interrupted.set()
    finally:
        if lost is None and _jvm_lost(None) is None:
            spark.stop()
    if interrupted.is_set():  # Spark may tell a job cancelled for Ctrl-C as its failure
        status, line = INTERRUPTED_EXIT, "interrupted; the run is safe to start again"
    if line is not None:  # last, after whatever Spark prints as it stops
        if argv is None:  # the command itself, not a caller that keeps its JVM
            _jvm_ended()
        parser.exit(status, f"{parser.prog}: {line}\n")
    return status


def _jvm_lost(exc: BaseException | None) -> str | None:
    """Why the job cannot go on, when Spark's JVM is gone (out of memory, or
    killed) or ``exc`` is its connection lost; None while it is there."""
    from py4j.protocol import Py4JError, Py4JJavaError  # type: ignore[import-untyped]
    from pyspark import SparkContext

    # A Py4J error that is no Java exception is the gateway's own: its connection.
    lost = isinstance(exc, ConnectionError) or (
        isinstance(exc, Py4JError) and not isinstance(exc, Py4JJavaError)
    )
    proc = getattr(SparkContext._gateway, "proc", None)
    code = None
    if proc is not None:
        # The connection may drop a moment before the process is seen to end.
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = proc.wait(timeout=10 if lost else 0)
    if code is None and not lost:
        return None
    how = (
        "its connection was lost" if code is None
        else "exit code 52: out of memory" if code == 52  # Spark's own code for it
        else f"killed by signal {-code}" if code < 0
        else f"exit code {code}"
    )  # fmt: skip
    return f"Spark's JVM ended ({how}); the run is safe to start again"


def _jvm_ended() -> None:
    """End the JVM this command started, and wait for it: an interrupted job's
    threads may print as it goes down, and the command's line comes last."""
    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    if proc is None or proc.stdin is None:  # a JVM that spark-submit started
        return
    proc.stdin.close()  # the gateway exits when its standard input closes
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)


def _queue_options(parser: Parser, args: argparse.Namespace) -> None:
    """``--input queue:NAME``, ``--output-queue`` and ``--trigger``, checked and
    parsed onto ``args`` (``queue``, ``route``, ``every``, ``queues_used``)."""
    from ._queues._config import check_input_queue
    from ._queues._sink import OutputRoute
    from ._settings import parse_duration

    args.queue, args.route, args.every, args.queues_used = None, None, None, []
    if args.input.startswith("queue:"):
        try:
            args.queue = check_input_queue(args.input[6:], f"--input {args.input!r}: the queue")
        except ValueError as exc:
            parser.error(str(exc))
        if not args.checkpoint:
            parser.error(f"--input {args.input} (a stream) needs --checkpoint")
        args.queues_used.append(("--input", args.queue))
    for option, value, low, high in (("--queue-lock", args.queue_lock, 1, 7 * 24 * 3600),
                                     ("--max-messages-per-trigger",
                                      args.max_messages_per_trigger, 1, None),
                                     ("--max-dequeue-count", args.max_dequeue_count, 1,
                                      None)):  # fmt: skip
        if value < low or (high is not None and value > high):
            parser.error(f"{option} must be between {low} and {high or 'any'}, got {value}")
    if args.output_queue:
        try:
            args.route = OutputRoute.parse(args.output_queue)
        except ValueError as exc:
            parser.error(str(exc))
        named = ({queue for _, queue in args.route.routes} | {args.route.default}) - {None}
        args.queues_used.extend(("--output-queue", queue) for queue in sorted(named))
    if args.trigger is not None:
        if not args.stream and args.queue is None:
            parser.error("--trigger needs --stream or --input queue:NAME")
        try:
            args.every = parse_duration(args.trigger)
        except ValueError as exc:
            parser.error(f"--trigger: {exc}")
    if args.queue is not None:
        from ._queue_stream import queue_source_missing

        missing = queue_source_missing()
        if missing is not None:
            parser.exit(REFUSED_EXIT, f"{parser.prog}: error: --input {args.input}: {missing}\n")


def _run(spark: Any, args: argparse.Namespace, settings: Any) -> int:
    """The job itself: its summaries printed, its exit status returned."""
    from ._job import run_batch
    from ._queues._sink import Delivery, send_written_outputs

    if args.stream or args.queue is not None:
        return _run_stream(spark, args, settings)
    summary = run_batch(
        spark, args.input, args.output, settings,
        input_format=args.input_format, output_format=args.output_format,
        partitions=args.partitions, order_by=args.order_by, explain=args.explain,
    )  # fmt: skip
    print(summary.table(args.output))
    if args.route is not None:
        delivery = Delivery()
        delivery.add_sent(send_written_outputs(spark, args.output, args.output_format, args.route))
        print("\n".join(delivery.lines(outputs=True, messages=False)))
    return summary.exit_status


def _run_stream(spark: Any, args: argparse.Namespace, settings: Any) -> int:
    """A file or queue stream, each micro-batch's summary printed once it is written."""
    from ._queue_stream import run_queue
    from ._queues._sink import Delivery
    from ._stream import run_stream, stop_on_signals

    written: dict[int, Any] = {}

    def show(batch_id: int, delivery: Delivery) -> None:
        redelivery = None if args.queue is None else (args.queue, args.max_dequeue_count)
        table = written.pop(batch_id).table(f"{args.output}/batch={batch_id}", redelivery)
        lines = delivery.lines(outputs=args.route is not None, messages=args.queue is not None)
        print("\n".join([f"micro-batch {batch_id}:", table, *lines]), flush=True)

    stop = threading.Event() if args.every is not None else None
    with contextlib.nullcontext() if stop is None else stop_on_signals(stop):
        if args.queue is not None:
            summaries = run_queue(
                spark, args.queue, args.output, args.checkpoint, settings,
                output_format=args.output_format, partitions=args.partitions,
                order_by=args.order_by, output_queues=args.route, trigger=args.every, stop=stop,
                on_batch=written.__setitem__, on_delivery=show,
                max_messages=args.max_messages_per_trigger, visibility_timeout=args.queue_lock,
                max_dequeue_count=args.max_dequeue_count,
            )  # fmt: skip
        else:
            summaries = run_stream(
                spark, args.input, args.output, args.checkpoint, settings,
                input_format=args.input_format, output_format=args.output_format,
                partitions=args.partitions, order_by=args.order_by,
                max_files_per_trigger=args.max_files_per_trigger, output_queues=args.route,
                trigger=args.every, stop=stop, on_batch=written.__setitem__, on_delivery=show,
            )  # fmt: skip
    return max((s.exit_status for _, s in summaries), default=0)


@contextlib.contextmanager
def _ctrl_c_sets(pressed: threading.Event) -> Iterator[None]:
    """Set ``pressed`` on Ctrl-C, then let PySpark's own handler cancel the
    job: on some versions the job's error, not KeyboardInterrupt, reaches
    the command. Outside the main thread no handler can be installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)

    def on_ctrl_c(signum: int, frame: FrameType | None) -> None:
        pressed.set()
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_ctrl_c)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


if __name__ == "__main__":
    sys.exit(main())
