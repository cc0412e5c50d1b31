"""``python -m spark_driver run ...`` and ``python -m spark_driver demo``.

Exit statuses, each with one line on stderr that says why (see
docs/spark-pipeline.md, "Exit statuses"):

- 0: every message is completed, a duplicate or dead-lettered;
- 2 (``REFUSED_EXIT``): refused before any work: a bad option, missing
  credentials, a missing table or input, an output path that is a file;
- 3 (``UNSETTLED_EXIT``): some messages are abandoned or faulted, so a
  scheduler delivers the input again (the summary lists the first of them);
- 4 (``FAILED_EXIT``): the job stopped: ``--fail-fast`` met an abandoned or
  faulted message, or Spark failed;
- 130: interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any, Final, NoReturn

from ._checks import (
    Refused,
    check_input,
    check_table,
    check_writable_dir,
    note_replaced_output,
    spark_failure,
)
from ._settings import BUILTIN_HANDLERS, LOCAL_MASTER, SPARK_LOG_LEVELS

#: A job that stopped: ``--fail-fast`` met an unsettled message, or Spark failed.
FAILED_EXIT: Final = 4
#: A command refused before any work.
REFUSED_EXIT: Final = 2
#: Interrupted (Ctrl-C), as shells report a SIGINT.
INTERRUPTED_EXIT: Final = 130


class _Parser(argparse.ArgumentParser):
    """Refusals as one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


class _Help(argparse.HelpFormatter):
    """Each option's default in its help, unless there is none to state."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text:
            return text
        return f"{text} (default: %(default)s)".lstrip()


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
    parser = _Parser(prog="python -m spark_driver")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run",
        help="process a batch of messages (or, with --stream, a directory as a stream)",
        description="Credentials come from the environment only: STREAMSTONE_CONNECTION_STRING, "
        "or STREAMSTONE_ACCOUNT_URL with STREAMSTONE_SAS_TOKEN or a managed identity. "
        "Exit status: 0 if every message is completed, a duplicate or dead-lettered; "
        "2 if refused before any work; 3 if any is abandoned or faulted (deliver the input "
        "again); 4 if the job stopped (--fail-fast, or Spark failed); 130 if interrupted.",
        formatter_class=_Help,
    )
    run.add_argument("--input", required=True, help="input file or directory")
    run.add_argument(
        "--output",
        required=True,
        help="output directory; a batch run replaces the results of an earlier run there",
    )
    run.add_argument(
        "--input-format", choices=["json", "parquet"], default="json", help="JSON lines or Parquet"
    )
    run.add_argument(
        "--output-format", choices=["parquet", "json"], default="parquet", help="of every part"
    )
    run.add_argument("--table", default="handlerstate", help="table of the handler's state")
    run.add_argument(
        "--no-create-table",
        action="store_true",
        help="refuse to run if the table is missing (by default it is created)",
    )
    run.add_argument(
        "--account-url",
        help="storage account URL (sets STREAMSTONE_ACCOUNT_URL; secrets only ever from the "
        "environment)",
    )
    builtins = ", ".join(BUILTIN_HANDLERS)
    run.add_argument("--handler", default="shooting_range",
                     help=f"{builtins}, or package.module:attribute")  # fmt: skip
    run.add_argument(
        "--strategy", choices=["state", "outbox"], default="state",
        help="state versions per message, or an outbox of outputs",
    )  # fmt: skip
    run.add_argument(
        "--partitions", type=int, default=8, help="Spark partitions the keys are spread over"
    )
    run.add_argument("--order-by", help="column that orders messages within a key")
    run.add_argument(
        "--sent-at",
        metavar="COLUMN",
        help="column with each message's sent time (a timestamp, or ISO-8601 text with a "
        "zone, e.g. a broker's enqueued time): with retention, a message sent before what "
        "it removed is dead-lettered as late instead of applied again",
    )
    run.add_argument(
        "--concurrency",
        type=int,
        default=8,
        help="keys in flight at once inside each task (one thread each; 1: one key at a time)",
    )
    run.add_argument(
        "--keep-last",
        type=int,
        metavar="N",
        help="after each key's batch, remove its versions but the last N (the ones the batch "
        "touched always stay); duplicates of removed versions are no longer recognised",
    )
    run.add_argument(
        "--retain-for",
        metavar="DURATION",
        help="after each key's batch, remove its versions processed longer ago than this "
        "(7d, 36h, 1h30m, 90s); with --keep-last a version stays if either keeps it",
    )
    run.add_argument(
        "--retain-at-least",
        type=int,
        default=1,
        metavar="N",
        help="cut a key only once N versions can go (fewer, larger cuts: retention's "
        "requests come once per cut instead of once per batch)",
    )
    run.add_argument(
        "--compression",
        choices=["zlib"],
        help="store new states and outbox outputs compressed (default: as they are; "
        "either form reads back)",
    )
    run.add_argument(
        "--transport",
        choices=["wire", "sdk"],
        default="wire",
        help="how storage requests travel: spoken by the engine over HTTP, or through "
        "azure-data-tables (the reference)",
    )
    run.add_argument("--fail-fast", action="store_true", help="fail the job on a handler error")
    run.add_argument(
        "--master",
        help=f"Spark master (default: the one spark-submit set, else {LOCAL_MASTER})",
    )
    run.add_argument(
        "--stream",
        action="store_true",
        help="treat --input as a directory stream: process the files new since the "
        "checkpoint, one micro-batch each under OUTPUT/batch=N, then exit",
    )
    run.add_argument("--checkpoint", help="checkpoint directory (streaming)")
    run.add_argument(
        "--max-files-per-trigger",
        type=int,
        metavar="N",
        help="at most N new files per micro-batch (streaming; default: all)",
    )
    run.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="Python logging level on the driver (the Azure SDK logs requests at DEBUG)",
    )
    run.add_argument(
        "--spark-log-level",
        default="ERROR",
        choices=list(SPARK_LOG_LEVELS),
        help="Spark's own (JVM) log level, from the JVM's start when this command starts it",
    )
    run.add_argument("--explain", action="store_true", help="print the Spark plan of the outputs")
    demo_command = commands.add_parser(
        "demo", help="the ShootingRange demo: twice over the same input"
    )
    demo_command.add_argument("--strategy", choices=["state", "outbox"], default="state")
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
    if args.max_files_per_trigger is not None:
        if not args.stream:
            parser.error("--max-files-per-trigger needs --stream")
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
    try:
        resolve_handler(args.handler)
    except ValueError as exc:
        parser.error(str(exc))
    if (args.master or ("" if launched_with_master() else LOCAL_MASTER)).startswith("local"):
        _workers_import_from(args.handler)
    configure_logging(args.log_level)
    if args.account_url:
        os.environ["STREAMSTONE_ACCOUNT_URL"] = args.account_url
    try:
        check_input(args.input, args.input_format)
        check_writable_dir("--output", args.output)
        check_writable_dir("--checkpoint", args.checkpoint)
        check_table(args.table, create=not args.no_create_table)
        note_replaced_output(args.output, args.stream)
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
    )
    spark = session(args.master, spark_log_level=args.spark_log_level)
    print(f"spark master: {spark.sparkContext.master}", file=sys.stderr)
    status, line = 0, None
    interrupted = threading.Event()
    try:
        with _ctrl_c_sets(interrupted):
            status = _run(spark, args, settings)
    except ValueError as exc:  # bad input found once Spark read it (e.g. the order column)
        status, line = REFUSED_EXIT, f"error: {exc}"
    except Exception as exc:  # Spark's failure, or --fail-fast's stop: one line, status 4
        logging.getLogger("spark_driver").debug("the job failed", exc_info=True)
        status, line = FAILED_EXIT, f"error: {spark_failure(exc)}"
    except KeyboardInterrupt:
        interrupted.set()
    finally:
        spark.stop()
    if interrupted.is_set():  # Spark may tell a job cancelled for Ctrl-C as its failure
        status, line = INTERRUPTED_EXIT, "interrupted; the run is safe to start again"
    if line is not None:  # last, after whatever Spark prints as it stops
        parser.exit(status, f"{parser.prog}: {line}\n")
    return status


def _run(spark: Any, args: argparse.Namespace, settings: Any) -> int:
    """The job itself: its summaries printed, its exit status returned."""
    from ._job import run_batch
    from ._stream import run_stream

    if args.stream:
        summaries = run_stream(
            spark, args.input, args.output, args.checkpoint, settings,
            input_format=args.input_format, output_format=args.output_format,
            partitions=args.partitions,
            order_by=args.order_by, max_files_per_trigger=args.max_files_per_trigger,
        )  # fmt: skip
        for batch_id, summary in summaries:
            table = summary.table(f"{args.output}/batch={batch_id}")
            print(f"micro-batch {batch_id}:\n{table}")
        return max((s.exit_status for _, s in summaries), default=0)
    summary = run_batch(
        spark, args.input, args.output, settings,
        input_format=args.input_format, output_format=args.output_format,
        partitions=args.partitions, order_by=args.order_by, explain=args.explain,
    )  # fmt: skip
    print(summary.table(args.output))
    return summary.exit_status


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
