"""The command line as a new user meets it on a first day: typed as the README
and the handler guide write it, in a shell whose virtualenv is active, with a
handler module of their own. Each test asserts the exit status and the words.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from spark_driver import Summary, Unsettled
from spark_driver.__main__ import main
from spark_driver._checks import spark_failure

CART = """\
from handlers import HandlerContext, Message, handler


def quantity(body):
    return body["qty"]


@handler("ShoppingCart", None, types=["Add"])
def cart(state, message: Message, ctx: HandlerContext) -> None:
    state.setdefault("items", []).append(quantity(message.body))
"""
#: Where the handler fails on a body without "qty", as its reason names it.
WHERE = "(at cart.py:5 in quantity)"
FAILED = f"handler 'ShoppingCart' failed on message 'a-6': KeyError: 'qty' {WHERE}"

ROWS = [
    ("a-1", "c1", {"qty": 1}),
    ("a-6", "c1", {"quantity": 2}),  # the handler's KeyError: abandoned
    ("a-7", "c1", {"qty": 3}),  # after it in its key: abandoned too
    ("b/7", "c2", {"qty": 1}),  # an id no table can store: dead-lettered
    ("b#8", "c2", {"qty": 1}),
    ("b-9", "c2", {"qty": 4}),
    ("x-1", "c3", {"qty": 5}),
]


def _project(tmp_path: Path, connection_string: str) -> dict[str, str]:
    """A user's directory with their handler and input; the environment of a
    shell after `source .venv/bin/activate` and the README's export line."""
    (tmp_path / "cart.py").write_text(CART)
    with (tmp_path / "in.jsonl").open("w") as out:
        for message_id, key, body in ROWS:
            line = {"message_id": message_id, "key": key, "type": "Add", "body": json.dumps(body)}
            out.write(json.dumps(line) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    env["STREAMSTONE_CONNECTION_STRING"] = connection_string
    return env


def _run_cart(
    tmp_path: Path, connection_string: str, table_name: str, flags: str
) -> subprocess.CompletedProcess[str]:
    """The command as the handler guide writes it, typed in the user's directory
    (nothing on PYTHONPATH: local workers import ``cart`` from there too)."""
    env = _project(tmp_path, connection_string)
    command = (
        "python -m spark_driver run --handler cart:cart --input in.jsonl "
        f"--output out --table {table_name} {flags}"
    )
    return subprocess.run(
        ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def test_exit_3_names_each_unsettled_message_where_the_handler_failed_and_dead_letters_bad_ids(
    tmp_path: Path, connection_string: str, table_name: str
) -> None:
    done = _run_cart(tmp_path, connection_string, table_name, "--keep-last 1 --log-level INFO")

    assert done.returncode == 3, done.stderr[-3000:]
    notes = done.stdout.split("\n  ----")[-1].splitlines()[1:]
    assert notes == [
        "  all 2 abandoned or faulted messages (exit status 3: fix the handler, then deliver "
        "the input again):",
        f"    abandoned 'a-6' of key 'c1': {FAILED}",
        f"    abandoned 'a-7' of key 'c1': an earlier message of key 'c1' failed: {FAILED}",
        "  every one, with its reason: out/outcomes (status abandoned or faulted)",
        "  retention removed nothing from 3 keys: the versions a run touches always stay "
        "(its duplicates' too), so rerunning the same input removes none; a later run with "
        "newer messages does",
    ], done.stdout
    assert re.search(r"processed \(new version stored\)\s+3\n", done.stdout)
    # At INFO, the handler's part of the traceback, without the runtime's frames.
    logged = done.stderr.split("key 'c1': message 'a-6' abandoned: ")[1]
    trace = logged.split("The handler's frames, innermost last:\n")[1].split("KeyError: 'qty'")[0]
    assert re.fullmatch(
        r'  File "[^"]*cart\.py", line 10, in cart\n.*\n(.*\n)?'
        r'  File "[^"]*cart\.py", line 5, in quantity\n.*\n(.*\n)?',
        trace,
    ), trace

    outcomes = pd.read_parquet(tmp_path / "out" / "outcomes", dtype_backend="numpy_nullable")
    found = [
        (r.message_id, r.key, r.status, *(None if pd.isna(v) else v for v in (r.version, r.reason)))
        for r in outcomes.sort_values(["key", "message_id"]).itertuples()
    ]
    refusal = (
        "message id cannot be stored: event id {!r} contains {!r}; Azure Tables keys may not "
        "contain '/', '\\', '#', '?' or control characters"
    )
    assert found == [
        ("a-1", "c1", "completed", 1, None),
        ("a-6", "c1", "abandoned", None, FAILED),
        ("a-7", "c1", "abandoned", None, f"an earlier message of key 'c1' failed: {FAILED}"),
        ("b#8", "c2", "dead_lettered", None, refusal.format("b#8", "#")),
        ("b-9", "c2", "completed", 1, None),
        ("b/7", "c2", "dead_lettered", None, refusal.format("b/7", "/")),
        ("x-1", "c3", "completed", 1, None),
    ]
    assert str(outcomes["version"].dtype) == "Int32"


def test_fail_fast_stops_with_status_4_and_one_line_naming_the_handler_line(
    tmp_path: Path, connection_string: str, table_name: str
) -> None:
    done = _run_cart(tmp_path, connection_string, table_name, "--fail-fast --partitions 1")

    assert done.returncode == 4, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert lines[-1] == (
        "python -m spark_driver: error: stopped by --fail-fast: message 'a-6' of key 'c1' "
        f"abandoned: {FAILED}"
    ), done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "py4j" not in done.stderr.lower()
    assert len(lines) <= 5, done.stderr


@pytest.fixture
def user_dir(tmp_path: Path, connection_string: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    _project(tmp_path, connection_string)
    monkeypatch.setenv("STREAMSTONE_CONNECTION_STRING", connection_string)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line of a command refused before Spark starts (exit status 2)."""
    with pytest.raises(SystemExit) as done:
        main(["run", *args])
    err = capsys.readouterr().err
    assert (done.value.code, err.count("\n")) == (2, 1), err
    assert err.startswith("python -m spark_driver: error: ")
    return err.removeprefix("python -m spark_driver: error: ").rstrip("\n")


def test_refusals_name_the_flag_or_variable_to_fix(
    user_dir: Path,
    table_name: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base = ["--handler", "cart:cart", "--input", "in.jsonl", "--table", table_name]
    (user_dir / "taken").write_text("a file, not a directory")
    assert _refused([*base, "--output", "taken"], capsys) == (
        "--output 'taken' is a file; name a directory (it is created if missing)"
    )
    assert _refused([*base, "--output", "taken/out"], capsys).startswith(
        "--output 'taken/out' is under "
    )
    pd.DataFrame({"message_id": ["m"], "key": ["k"], "type": ["Add"], "body": ["{}"]}).to_parquet(
        user_dir / "in.parquet"
    )
    parquet = ["--handler", "cart:cart", "--input", "in.parquet", "--table", table_name]
    assert _refused([*parquet, "--output", "out"], capsys) == (
        "--input 'in.parquet' holds Parquet ('in.parquet'): add --input-format parquet"
    )
    assert _refused([*base, "--output", "out", "--input-format", "parquet"], capsys) == (
        "--input 'in.jsonl' is not Parquet ('in.jsonl' does not start as Parquet files do): "
        "leave out --input-format parquet for JSON lines"
    )
    named = ["--input", "in.jsonl", "--output", "out", "--handler"]
    assert _refused([*named, "cart:cartz"], capsys) == (
        "handler 'cart:cartz': module 'cart' has no attribute 'cartz'; its handlers: cart "
        "(see --help)"
    )
    assert _refused([*named, "cart:quantity"], capsys) == (
        "handler 'cart:quantity': 'quantity' is a function, not a handlers.Handler "
        "(declare it with @handler or subclass Handler) (see --help)"
    )
    assert _refused([*base[:4], "--table", "Tables", "--output", "out"], capsys) == (
        "--table 'Tables' is reserved: Azure Tables lists its tables under it"
    )

    connection_string = os.environ["STREAMSTONE_CONNECTION_STRING"]  # user_dir's
    wrong_key = re.sub(r"AccountKey=[^;]+", "AccountKey=" + "QUJD" * 22, connection_string)
    monkeypatch.setenv("STREAMSTONE_CONNECTION_STRING", wrong_key)
    assert _refused([*base, "--output", "out"], capsys) == (
        "the storage account refused to authenticate the request (403 AuthorizationFailure) "
        f"for table {table_name!r}: check the account key in STREAMSTONE_CONNECTION_STRING"
    )
    monkeypatch.setenv("STREAMSTONE_CONNECTION_STRING", "garbage")
    assert _refused([*base, "--output", "out"], capsys) == (
        "STREAMSTONE_CONNECTION_STRING is not a valid connection string: "
        "Connection string is either blank or malformed."
    )
    monkeypatch.delenv("STREAMSTONE_CONNECTION_STRING")
    monkeypatch.delenv("STREAMSTONE_ACCOUNT_URL", raising=False)
    assert _refused([*base, "--output", "out"], capsys) == (
        "no storage account configured: set STREAMSTONE_CONNECTION_STRING, or "
        "STREAMSTONE_ACCOUNT_URL (with STREAMSTONE_SAS_TOKEN, or without it to sign in as an "
        "Azure identity: a managed identity, or az login)"
    )
    monkeypatch.setenv("STREAMSTONE_SAS_TOKEN", "sv=2020-08-04&sig=x")
    assert _refused([*base, "--output", "out"], capsys) == (
        "STREAMSTONE_SAS_TOKEN needs STREAMSTONE_ACCOUNT_URL"
    )
    assert not (user_dir / "out").exists()  # nothing was written by any refusal


def test_the_summary_names_the_first_five_unsettled_messages_and_counts_the_rest() -> None:
    figures: dict[str, Any] = {
        "messages_in": 9, "processed": 2, "duplicates": 0, "new_outputs": 0,
        "reemitted_outputs": 0, "dead_lettered": 0, "abandoned": 6, "faulted": 1,
        "conflicts_retried": 0,
    }  # fmt: skip
    shown = tuple(
        Unsettled("abandoned", "k", f"m-{n}", f"reason {n}\nsecond line") for n in range(5)
    )
    notes = Summary(**figures, unsettled=shown).table("out").split("------\n")[-1].splitlines()
    assert notes == [
        "  the first 5 of 7 abandoned or faulted messages (exit status 3: deliver the input "
        "again, which is safe):",
        *(f"    abandoned 'm-{n}' of key 'k': reason {n} second line" for n in range(5)),
        "  every one, with its reason: out/outcomes (status abandoned or faulted)",
    ]
    one = {**figures, "abandoned": 0, "faulted": 1}
    only = (Unsettled("faulted", "k", "m-9", "TimeoutError: read timed out"),)
    assert Summary(**one, unsettled=only, retained_nothing=1).table().splitlines()[-4:] == [
        "  the one abandoned or faulted message (exit status 3: deliver the input again, "
        "which is safe):",
        "    faulted 'm-9' of key 'k': TimeoutError: read timed out",
        "  every one, with its reason: the outcomes (status abandoned or faulted)",
        "  retention removed nothing from 1 keys: the versions a run touches always stay (its "
        "duplicates' too), so rerunning the same input removes none; a later run with newer "
        "messages does",
    ]
    # The advice fits the input: a handler to fix first; a queue that redelivers by itself.
    failing = Summary(**figures, unsettled=shown, handler_failures=1)
    assert (
        failing.table("out").count("(exit status 3: fix the handler, then deliver the input") == 1
    )
    assert (
        failing.table("out", ("orders", 5)).count(
            "(exit status 3; queue 'orders' delivers each again by itself after its backoff, and "
            "poisons one still failing on receive 5: fix the handler before then):"
        )
        == 1
    )
    assert Summary(**one, unsettled=only).advice(("orders", 5)) == (
        "exit status 3; queue 'orders' delivers each again by itself after its backoff, and "
        "poisons one still failing on receive 5"
    )
    settled = {**figures, "abandoned": 0, "faulted": 0}
    assert (
        Summary(**settled, unsettled=()).table().endswith("-" * 42)
    )  # nothing to add below the figures
    assert "unsettled" not in Summary(**settled, unsettled=()).figures()


def test_a_failed_task_is_told_by_the_python_error_it_raised() -> None:
    # The shape of Spark's message for a task whose Python worker raised.
    text = (
        "An error occurred while calling o95.save.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in "
        "stage 3.0 failed 1 times, most recent failure: Lost task 0.0 in stage 3.0: "
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/venv/lib/python3.11/site-packages/spark_driver/_settings.py", line 39, in x\n'
        '    raise ValueError(f"handler {spec!r}: cannot import {module_name!r} ({exc})")\n'
        "ValueError: handler 'cart:cart': cannot import 'cart' (No module named 'cart')\n"
        "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(x.scala:1)\n"
    )
    assert spark_failure(RuntimeError(text)) == (
        "the job failed: a task raised ValueError: handler 'cart:cart': cannot import 'cart' "
        "(No module named 'cart') (--log-level DEBUG prints the whole trace)"
    )
    assert spark_failure(RuntimeError("Java heap space\nat x")) == (
        "the job failed: RuntimeError: Java heap space (--log-level DEBUG prints the whole trace)"
    )


SLOW = """\
import time

from handlers import HandlerContext, Message, handler


@handler("Slow", None, types=["Add"])
def slow(state, message: Message, ctx: HandlerContext) -> None:
    time.sleep(30)  # longer than the test waits: Ctrl-C comes first
"""


def test_ctrl_c_stops_the_run_with_status_130_and_one_line(
    tmp_path: Path, connection_string: str, table_name: str
) -> None:
    env = _project(tmp_path, connection_string)
    (tmp_path / "slow.py").write_text(SLOW)
    run = subprocess.Popen(
        ["python", "-m", "spark_driver", "run", "--handler", "slow:slow", "--input", "in.jsonl",
         "--output", "out", "--table", table_name, "--partitions", "1"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert run.stderr is not None
    seen = []
    for line in run.stderr:  # the job starts once the master is chosen
        seen.append(line)
        if line.startswith("spark master:"):
            break
    time.sleep(5)  # inside the job now: a task sleeps in the handler
    run.send_signal(signal.SIGINT)
    _, rest = run.communicate(timeout=120)

    assert run.returncode == 130, "".join(seen) + rest
    assert rest.strip().splitlines()[-1] == (
        "python -m spark_driver: interrupted; the run is safe to start again"
    ), rest
    assert "Traceback" not in rest
