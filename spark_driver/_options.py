"""The command's options: ``python -m spark_driver run ...`` and ``demo``."""

from __future__ import annotations

import argparse
from typing import NoReturn

from ._settings import BUILTIN_HANDLERS, LOCAL_MASTER, SPARK_LOG_LEVELS

__all__ = ["Parser", "build_parser"]


class Parser(argparse.ArgumentParser):
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


def build_parser() -> Parser:
    """The parser of the whole command, its ``run`` and ``demo`` subcommands."""
    parser = Parser(prog="python -m spark_driver")
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
    run.add_argument(
        "--input",
        required=True,
        help="input file or directory, or queue:NAME for an Azure Storage Queue (a stream: "
        "needs --checkpoint and PySpark 4)",
    )
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
    run.add_argument(
        "--order-by",
        help="column that orders messages within a key (in JSON lines read as text: numbers "
        "order by value)",
    )
    run.add_argument(
        "--sent-at",
        metavar="COLUMN",
        help="column with each message's sent time (a timestamp, or ISO-8601 text with a "
        "zone; from a queue, produced: when it was first produced, or inserted_on): with "
        "retention, a message sent before what it removed is dead-lettered as late instead "
        "of applied again",
    )
    run.add_argument(
        "--tokens",
        action="store_true",
        help="outputs to the handler's own keys carry a token their receiver's write "
        "consumes, so a copy is dropped however late, whatever retention removed (state "
        "strategy; a handler that names its types)",
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
    run.add_argument(
        "--trace-context",
        choices=["parent", "link"],
        default="parent",
        help="what an input message's trace context is to its spans (OpenTelemetry): "
        "their parent, or a link from a trace of their own",
    )
    run.add_argument(
        "--fail-fast",
        action="store_true",
        help="stop the job (exit 4) at the first abandoned or faulted message",
    )
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
        "--trigger",
        metavar="DURATION",
        help="a micro-batch every DURATION (10s, 1m) until SIGTERM or Ctrl-C, which let the "
        "micro-batch in progress finish (streaming; default: process what is there, then exit)",
    )
    run.add_argument(
        "--output-queue",
        action="append",
        metavar="[TYPE=]QUEUE",
        help="send the outputs to Azure Storage Queues too, after each run or micro-batch is "
        "written: QUEUE takes every type, TYPE=QUEUE one type (repeat it)",
    )
    run.add_argument(
        "--queue-lock",
        type=int,
        default=300,
        metavar="SECONDS",
        help="visibility timeout of each queue message received (queue input): it must "
        "outlast a micro-batch; a failed batch's messages come again once it runs out",
    )
    run.add_argument(
        "--max-messages-per-trigger",
        type=int,
        default=1000,
        metavar="N",
        help="at most N queue messages per micro-batch (queue input)",
    )
    run.add_argument(
        "--max-dequeue-count",
        type=int,
        default=5,
        metavar="N",
        help="a queue message that failed on its Nth receive, or was received more often "
        "without being completed, goes to <queue>-poison (queue input)",
    )
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
    return parser
