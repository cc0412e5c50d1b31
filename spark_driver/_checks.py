"""The checks the command makes before Spark starts, each refusal one line in
the words of whoever typed the command, and the one line of a job that failed."""

from __future__ import annotations

import os
import re
import sys
from typing import Any

__all__ = [
    "TABLE_NAME", "Refused", "check_input", "check_queue", "check_table", "check_writable_dir",
    "note_replaced_output", "spark_failure",
]  # fmt: skip

#: Where a stream's checkpoint records the input it was started on (``_intake``).
INPUT_RECORD = ("streamstone", "input.json")
#: Azure's rule for table names.
TABLE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]{2,62}")


class Refused(Exception):
    """A check before any work failed; the message is the one line to print."""


def check_table(table: str, create: bool) -> None:
    """The account is configured and the table is there (created unless told not to)."""
    from azure.core.exceptions import AzureError, HttpResponseError, ResourceNotFoundError

    from streamstone_py import TableConfig

    if not TABLE_NAME.fullmatch(table):
        raise Refused(
            f"--table {table!r} is not a valid table name (3 to 63 letters and digits, "
            "starting with a letter)"
        )
    try:
        config = TableConfig.from_env(table_name=table)
    except ValueError as exc:
        raise Refused(str(exc).replace("table name ", "--table ", 1)) from None
    with config.table_client() as client:
        try:
            next(iter(client.query_entities("PartitionKey eq ''", results_per_page=1)), None)
        except ResourceNotFoundError:
            if not create:
                raise Refused(f"table {table!r} does not exist (--no-create-table)") from None
            client.create_table()
            print(f"created table {table!r}", file=sys.stderr)
        except HttpResponseError as exc:
            if exc.status_code != 403:
                raise Refused(f"table {table!r} answered: {first_line(exc)}") from None
            secret = {
                "connection_string": "the account key in STREAMSTONE_CONNECTION_STRING",
                "sas": "the SAS token in STREAMSTONE_SAS_TOKEN (or its permissions)",
                "default_credential": "the Azure identity's role on the account",
            }[config.mode]
            raise Refused(
                f"the storage account refused to authenticate the request (403 "
                f"{code(exc)}) for table {table!r}: check {secret}"
            ) from None
        except AzureError as exc:
            raise Refused(f"cannot reach table {table!r}: {first_line(exc)}") from None


def check_queue(option: str, queue: str) -> None:
    """The account names a Queue service, and ``queue`` is there (created when missing)."""
    from azure.core.exceptions import AzureError, HttpResponseError, ResourceNotFoundError

    from ._queues._config import QueueConfig

    try:
        config = QueueConfig.from_env()
    except ValueError as exc:
        raise Refused(f"{option}: {exc}") from None
    client = config.service().get_queue_client(queue)
    try:
        client.get_queue_properties()
    except ResourceNotFoundError:
        client.create_queue()
        print(f"created queue {queue!r}", file=sys.stderr)
    except HttpResponseError as exc:
        if exc.status_code != 403:
            raise Refused(f"queue {queue!r} ({option}) answered: {first_line(exc)}") from None
        secret = (
            "the account key in STREAMSTONE_CONNECTION_STRING"
            if config.connection_string
            else "the SAS token in STREAMSTONE_SAS_TOKEN (or its permissions)"
            if config.sas_token
            else "the Azure identity's role on the account"
        )
        raise Refused(
            f"the storage account refused to authenticate the request (403 {code(exc)}) "
            f"for queue {queue!r} ({option}): check {secret}"
        ) from None
    except AzureError as exc:
        raise Refused(f"cannot reach queue {queue!r} ({option}): {first_line(exc)}") from None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def code(exc: Any) -> str:
    code = getattr(exc, "error_code", None)
    return str(getattr(code, "value", code) or "no error code")


def check_input(path: str, input_format: str, checkpoint: str | None = None) -> None:
    """The input exists, and its files are in the format the command names
    (unless a stream's ``checkpoint`` holds the input it was started on: a
    file in another format is then the stream's to dead-letter, not a reason
    to stop it)."""
    if "://" in path:
        return
    if not os.path.exists(path):
        raise Refused(f"--input {path!r} does not exist")
    if checkpoint is not None and os.path.exists(os.path.join(checkpoint, *INPUT_RECORD)):
        return
    first = first_file(path)
    if first is None:
        return
    with open(first, "rb") as file:
        head = file.read(4)
    if head == b"PAR1" and input_format == "json":
        raise Refused(f"--input {path!r} holds Parquet ({first!r}): add --input-format parquet")
    if head != b"PAR1" and head and input_format == "parquet":
        raise Refused(
            f"--input {path!r} is not Parquet ({first!r} does not start as Parquet "
            "files do): leave out --input-format parquet for JSON lines"
        )


def first_file(path: str) -> str | None:
    """The first data file Spark would read at ``path`` (hidden ones it skips)."""
    if os.path.isfile(path):
        return path
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        for name in sorted(files):
            # Those Spark leaves out: hidden, or in progress (Hadoop's copies too).
            if not name.startswith((".", "_")) and not name.endswith("._COPYING_"):
                return os.path.join(root, name)
    return None


def check_writable_dir(option: str, path: str | None) -> None:
    """A local output or checkpoint path can be a directory: not a file, nor under one."""
    if path is None or "://" in path:
        return
    if os.path.exists(path) and not os.path.isdir(path):
        raise Refused(f"{option} {path!r} is a file; name a directory (it is created if missing)")
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise Refused(f"{option} {path!r} is under {parent!r}, which is a file")
    if not os.access(parent if not os.path.exists(path) else path, os.W_OK):
        raise Refused(f"{option} {path!r} cannot be written by this user")


def spark_failure(exc: BaseException) -> str:
    """The one line to print for a job that Spark failed: a ``--fail-fast`` stop
    as the executor worded it, else the Python error a task died of, else the
    first line of the error."""
    text = str(exc)
    found = re.search(r"FailFastError: (.*)", text)
    if found:
        return f"stopped by --fail-fast: {found[1].strip()}"
    raised = _python_error(text)
    if raised is not None:
        return f"the job failed: a task raised {raised} (--log-level DEBUG prints the whole trace)"
    return (
        f"the job failed: {type(exc).__name__}: {first_line(exc)} "
        "(--log-level DEBUG prints the whole trace)"
    )


#: The last line of a Python traceback: the exception's qualified name and message.
_RAISED = re.compile(r"([A-Za-z_][\w.]*): (.+)")


def _python_error(text: str) -> str | None:
    """The error line of the last Python traceback in Spark's message, if any."""
    lines = text.splitlines()
    starts = [n for n, line in enumerate(lines) if "Traceback (most recent call last)" in line]
    if not starts:
        return None
    for line in lines[starts[-1] + 1 :]:
        found = _RAISED.fullmatch(line.strip())
        name = found[1].rsplit(".", 1)[-1] if found else ""
        if (
            found
            and not found[1].startswith(("org.", "java.", "scala.", "py4j."))
            and (name.endswith(("Error", "Exception", "Interrupt", "Exit", "Iteration")))
        ):
            return f"{name}: {found[2]}"
    return None


def note_replaced_output(path: str, stream: bool) -> None:
    """Say so, in one line, when a batch run is about to replace earlier results."""
    if not stream and "://" not in path and os.path.isdir(os.path.join(path, "outcomes")):
        print(f"--output {path!r} holds an earlier run: its results are replaced", file=sys.stderr)
