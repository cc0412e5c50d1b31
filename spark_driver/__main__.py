"""``python -m spark_driver run ...`` and ``python -m spark_driver demo``."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from ._settings import BUILTIN_HANDLERS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_driver")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run",
        help="process a batch of messages (or, with --stream, a directory as a stream)",
        description="Credentials come from the environment only: STREAMSTONE_CONNECTION_STRING, "
        "or STREAMSTONE_ACCOUNT_URL with STREAMSTONE_SAS_TOKEN or a managed identity.",
    )
    run.add_argument("--input", required=True, help="input file or directory")
    run.add_argument("--output", required=True, help="output directory")
    run.add_argument("--input-format", choices=["json", "parquet"], default="json")
    run.add_argument("--output-format", choices=["parquet", "json"], default="parquet")
    run.add_argument("--table", default="handlerstate", help="table of the handler's state")
    run.add_argument(
        "--account-url",
        help="storage account URL (sets STREAMSTONE_ACCOUNT_URL; secrets only ever from the "
        "environment)",
    )
    builtins = ", ".join(BUILTIN_HANDLERS)
    run.add_argument("--handler", default="shooting_range",
                     help=f"{builtins}, or package.module:attribute")  # fmt: skip
    run.add_argument("--strategy", choices=["state", "outbox"], default="state")
    run.add_argument("--partitions", type=int, default=8)
    run.add_argument("--order-by", help="column that orders messages within a key")
    run.add_argument("--fail-fast", action="store_true", help="fail the job on a handler error")
    run.add_argument("--master", default="local[2]")
    run.add_argument("--stream", action="store_true", help="treat --input as a directory stream")
    run.add_argument("--checkpoint", help="checkpoint directory (streaming)")
    run.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="Python logging level on the driver (the Azure SDK logs requests at DEBUG)",
    )
    run.add_argument("--explain", action="store_true", help="print the Spark plan of the outputs")
    commands.add_parser("demo", help="the ShootingRange demo: twice over the same input")
    args = parser.parse_args(argv)

    if args.command == "demo":
        from .demo import main as demo

        return demo()

    from ._job import run_batch, session
    from ._settings import JobSettings, resolve_handler
    from ._stream import run_stream

    if args.partitions < 1:
        parser.error(f"--partitions must be >= 1, got {args.partitions}")
    try:
        resolve_handler(args.handler)
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    if args.account_url:
        os.environ["STREAMSTONE_ACCOUNT_URL"] = args.account_url
    settings = JobSettings(
        table=args.table,
        handler=args.handler,
        strategy=args.strategy,
        fail_fast=args.fail_fast,
        log_level=args.log_level,
    )
    spark = session(args.master)
    try:
        if args.stream:
            if not args.checkpoint:
                parser.error("--stream needs --checkpoint")
            for batch_id, summary in run_stream(
                spark, args.input, args.output, args.checkpoint, settings,
                output_format=args.output_format, partitions=args.partitions,
                order_by=args.order_by,
            ):  # fmt: skip
                print(f"micro-batch {batch_id}:\n{summary.table()}")
        else:
            summary = run_batch(
                spark, args.input, args.output, settings,
                input_format=args.input_format, output_format=args.output_format,
                partitions=args.partitions, order_by=args.order_by, explain=args.explain,
            )  # fmt: skip
            print(summary.table())
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
