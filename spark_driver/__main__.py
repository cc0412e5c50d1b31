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
import logging
import os
import re
import sys
from typing import Any, Final, NoReturn

from ._settings import BUILTIN_HANDLERS, LOCAL_MASTER, SPARK_LOG_LEVELS

#: Azure's rule for table names.
_TABLE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]{2,62}")


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


class _Refused(Exception):
    """A check before any work failed; the message is the one line to print."""


def _check_table(table: str, create: bool) -> None:
    """The account is configured and the table is there (created unless told not to)."""
    from azure.core.exceptions import AzureError, HttpResponseError, ResourceNotFoundError

    from streamstone_py import TableConfig

    if not _TABLE_NAME.fullmatch(table):
        raise _Refused(
            f"--table {table!r} is not a valid table name (3 to 63 letters and digits, "
            "starting with a letter)"
        )
    try:
        config = TableConfig.from_env(table_name=table)
    except ValueError as exc:
        raise _Refused(str(exc).replace("table name ", "--table ", 1)) from None
    with config.table_client() as client:
        try:
            next(iter(client.query_entities("PartitionKey eq ''", results_per_page=1)), None)
        except ResourceNotFoundError:
            if not create:
                raise _Refused(f"table {table!r} does not exist (--no-create-table)") from None
            client.create_table()
            print(f"created table {table!r}", file=sys.stderr)
        except HttpResponseError as exc:
            if exc.status_code != 403:
                raise _Refused(f"table {table!r} answered: {_first_line(exc)}") from None
            secret = {
                "connection_string": "the account key in STREAMSTONE_CONNECTION_STRING",
                "sas": "the SAS token in STREAMSTONE_SAS_TOKEN (or its permissions)",
                "default_credential": "the Azure identity's role on the account",
            }[config.mode]
            raise _Refused(
                f"the storage account refused to authenticate the request (403 "
                f"{_code(exc)}) for table {table!r}: check {secret}"
            ) from None
        except AzureError as exc:
            raise _Refused(f"cannot reach table {table!r}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _code(exc: Any) -> str:
    code = getattr(exc, "error_code", None)
    return str(getattr(code, "value", code) or "no error code")


def _check_input(path: str, input_format: str) -> None:
    """The input exists, and its files are in the format the command names."""
    if "://" in path:
        return
    if not os.path.exists(path):
        raise _Refused(f"--input {path!r} does not exist")
    first = _first_file(path)
    if first is None:
        return
    with open(first, "rb") as file:
        head = file.read(4)
    if head == b"PAR1" and input_format == "json":
        raise _Refused(f"--input {path!r} holds Parquet ({first!r}): add --input-format parquet")
    if head != b"PAR1" and head and input_format == "parquet":
        raise _Refused(
            f"--input {path!r} is not Parquet ({first!r} does not start as Parquet "
            "files do): leave out --input-format parquet for JSON lines"
        )


def _first_file(path: str) -> str | None:
    """The first data file Spark would read at ``path`` (hidden ones it skips)."""
    if os.path.isfile(path):
        return path
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        for name in sorted(files):
            if not name.startswith((".", "_")):
                return os.path.join(root, name)
    return None


def _check_writable_dir(option: str, path: str | None) -> None:
    """A local output or checkpoint path can be a directory: not a file, nor under one."""
    if path is None or "://" in path:
        return
    if os.path.exists(path) and not os.path.isdir(path):
        raise _Refused(f"{option} {path!r} is a file; name a directory (it is created if missing)")
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise _Refused(f"{option} {path!r} is under {parent!r}, which is a file")
    if not os.access(parent if not os.path.exists(path) else path, os.W_OK):
        raise _Refused(f"{option} {path!r} cannot be written by this user")


def _spark_failure(exc: BaseException) -> str:
    """The one line to print for a job that Spark failed: a ``--fail-fast`` stop
    as the executor worded it, else the first line of the error."""
    found = re.search(r"FailFastError: (.*)", str(exc))
    if found:
        return f"stopped by --fail-fast: {found[1].strip()}"
    return (
        f"the job failed: {type(exc).__name__}: {_first_line(exc)} "
        "(--log-level DEBUG prints the whole trace)"
    )


def _note_replaced_output(path: str, stream: bool) -> None:
    """Say so, in one line, when a batch run is about to replace earlier results."""
    if not stream and "://" not in path and os.path.isdir(os.path.join(path, "outcomes")):
        print(f"--output {path!r} holds an earlier run: its results are replaced", file=sys.stderr)


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

    from ._job import run_batch
    from ._logs import configure as configure_logging
    from ._session import session
    from ._settings import JobSettings, parse_duration, resolve_handler
    from ._stream import run_stream

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
    configure_logging(args.log_level)
    if args.account_url:
        os.environ["STREAMSTONE_ACCOUNT_URL"] = args.account_url
    try:
        _check_input(args.input, args.input_format)
        _check_writable_dir("--output", args.output)
        _check_writable_dir("--checkpoint", args.checkpoint)
        _check_table(args.table, create=not args.no_create_table)
        _note_replaced_output(args.output, args.stream)
    except _Refused as exc:
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
    try:
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
    except ValueError as exc:  # bad input found once Spark read it (e.g. the order column)
        parser.exit(REFUSED_EXIT, f"{parser.prog}: error: {exc}\n")
    except KeyboardInterrupt:
        parser.exit(
            INTERRUPTED_EXIT, f"{parser.prog}: interrupted; the run is safe to start again\n"
        )
    except Exception as exc:  # Spark's failure, or --fail-fast's stop: one line, status 4
        logging.getLogger("spark_driver").debug("the job failed", exc_info=True)
        parser.exit(FAILED_EXIT, f"{parser.prog}: error: {_spark_failure(exc)}\n")
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
