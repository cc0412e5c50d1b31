"""The Azurite launcher: loopback only, telemetry off, and data that survives a restart on disk."""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.core.exceptions import ResourceNotFoundError, ServiceRequestError
from azure.data.tables import TableServiceClient
from azure.storage.queue import QueueClient

from azurite.launcher import AzuriteError, AzuriteTable


@pytest.fixture(autouse=True)
def ctrl_c_as_a_terminal_gives_it() -> Iterator[None]:
    """The processes these tests start take SIGINT as a terminal's Ctrl-C gives
    it: a child inherits an ignored or blocked SIGINT from the test's process
    (pytest's worker, as earlier tests or the way it was started left it), and
    a Python started so never raises KeyboardInterrupt."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        if previous is not None:  # None: a handler set outside Python, left as it is
            signal.signal(signal.SIGINT, previous)


def _write_then_restart(azurite: AzuriteTable) -> TableServiceClient:
    service = TableServiceClient.from_connection_string(azurite.connection_string)
    service.create_table("kept").create_entity({"PartitionKey": "p", "RowKey": "r", "N": 1})
    # At once: Azurite autosaves its database every 5 s, so only a graceful stop keeps this.
    azurite.restart()
    return TableServiceClient.from_connection_string(azurite.connection_string)


def test_a_restart_on_disk_keeps_a_write_made_just_before(tmp_path: Path) -> None:
    with AzuriteTable(location=tmp_path / "data") as azurite:
        port = azurite.port
        service = _write_then_restart(azurite)
        assert azurite.port == port
        row = service.get_table_client("kept").get_entity("p", "r")
        assert (row["PartitionKey"], row["RowKey"], row["N"]) == ("p", "r", 1)


def test_a_restart_in_memory_starts_empty() -> None:
    with AzuriteTable() as azurite:
        service = _write_then_restart(azurite)
        with pytest.raises(ResourceNotFoundError):
            service.get_table_client("kept").get_entity("p", "r")


def test_azurite_listens_on_loopback_with_telemetry_off() -> None:
    with AzuriteTable() as azurite:
        assert azurite.endpoint.startswith("http://127.0.0.1:")
        assert azurite._process is not None
        args = Path(f"/proc/{azurite._process.pid}/cmdline").read_bytes().split(b"\0")
        assert args[args.index(b"--tableHost") + 1] == b"127.0.0.1"
        assert b"--disableTelemetry" in args
        assert b"--inMemoryPersistence" in args


def test_the_queue_service_runs_beside_on_loopback_and_keeps_messages_on_disk(
    tmp_path: Path,
) -> None:
    with AzuriteTable(location=tmp_path / "data", queues=True) as azurite:
        assert azurite.queue is not None
        assert azurite.queue._process is not None
        args = Path(f"/proc/{azurite.queue._process.pid}/cmdline").read_bytes().split(b"\0")
        assert args[args.index(b"--queueHost") + 1] == b"127.0.0.1"
        assert b"--disableTelemetry" in args
        table_port, queue_port = azurite.port, azurite.queue.port
        assert queue_port != table_port
        assert azurite.connection_string.endswith(
            f";TableEndpoint=http://127.0.0.1:{table_port}/devstoreaccount1;"
            f"QueueEndpoint=http://127.0.0.1:{queue_port}/devstoreaccount1;"
        )
        # One connection string serves both SDKs.
        tables = TableServiceClient.from_connection_string(azurite.connection_string)
        tables.create_table("beside").create_entity({"PartitionKey": "p", "RowKey": "r"})
        queue = QueueClient.from_connection_string(azurite.connection_string, "commands")
        queue.create_queue()
        queue.send_message("fire at 7")

        azurite.restart()  # both services, the same ports, the same directory

        assert (azurite.port, azurite.queue.port) == (table_port, queue_port)
        again = QueueClient.from_connection_string(azurite.connection_string, "commands")
        [message] = again.receive_messages(visibility_timeout=30)
        assert message.content == "fire at 7"
        assert tables.get_table_client("beside").get_entity("p", "r")["RowKey"] == "r"
    assert azurite.queue._process is None  # stopped with the table service


def test_one_service_stops_and_starts_alone(tmp_path: Path) -> None:
    with AzuriteTable(location=tmp_path / "data", queues=True) as azurite:
        assert azurite.queue is not None
        tables = TableServiceClient.from_connection_string(azurite.connection_string)
        tables.create_table("alone").create_entity({"PartitionKey": "p", "RowKey": "r"})
        queue = QueueClient.from_connection_string(azurite.connection_string, "alone")
        queue.create_queue()
        table_port = azurite.port

        azurite.stop("table")  # an outage of the Table service only

        assert (azurite.running, azurite.queue.running) == (False, True)
        hasty = TableServiceClient.from_connection_string(azurite.connection_string, retry_total=0)
        with pytest.raises(ServiceRequestError):
            hasty.get_table_client("alone").get_entity("p", "r")
        queue.send_message("still here")
        azurite.start("table")
        assert (azurite.running, azurite.port) == (True, table_port)
        assert tables.get_table_client("alone").get_entity("p", "r")["RowKey"] == "r"
        azurite.stop("queue")
        assert (azurite.running, azurite.queue.running) == (True, False)
        azurite.start("queue")
        [message] = queue.receive_messages(visibility_timeout=30)
        assert message.content == "still here"
        with pytest.raises(ValueError, match="service must be 'table' or 'queue', got 'blob'"):
            azurite.stop("blob")  # type: ignore[arg-type]
    with AzuriteTable() as alone, pytest.raises(AzuriteError, match="no Queue service runs"):
        alone.stop("queue")


# --- Azurite never outlives the launcher ----------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie (exited, not yet reaped by its parent) is gone too.
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" in status.read_text()


def _wait_for(path: Path, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.1)
    raise AssertionError(f"{path} was not written in {timeout} s")


CHILD = """
import os, sys, time
with open(sys.argv[1] + ".tmp", "w") as out:
    out.write(f"{os.getpid()} {os.environ['STREAMSTONE_CONNECTION_STRING']}\\n")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(120)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_to_the_launcher_stops_the_command_and_azurite(
    tmp_path: Path, sig: signal.Signals
) -> None:
    ready = tmp_path / "ready"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "azurite.launcher", "--", sys.executable, "-c", CHILD, str(ready)],
        cwd=tmp_path,  # any directory: the launcher finds its own files
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    pid, connection_string = _wait_for(ready).split()
    port = int(connection_string.split("TableEndpoint=http://127.0.0.1:")[1].split("/")[0])
    assert launcher_answers(port)

    launcher.send_signal(sig)

    assert launcher.wait(timeout=60) == 128 + sig
    assert _gone(int(pid))
    assert not launcher_answers(port)


def launcher_answers(port: int) -> bool:
    from azurite.launcher import _answers

    return _answers(port)


def test_ctrl_c_during_start_up_leaves_no_process(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    fake = tmp_path / "azurite-table"
    # Starts, never answers: the launcher is still waiting when Ctrl-C comes.
    fake.write_text(f'#!/bin/sh\necho "$$" > {pid_file}.tmp\nmv {pid_file}.tmp {pid_file}\n'
                    "exec sleep 120\n")  # fmt: skip
    fake.chmod(0o755)
    script = (
        "from azurite.launcher import AzuriteTable\n"
        f"AzuriteTable(binary={str(fake)!r}, startup_timeout=120).start()\n"
    )
    starting = subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 30
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    fake_pid = int(pid_file.read_text())

    starting.send_signal(signal.SIGINT)

    _, err = starting.communicate(timeout=30)
    assert "KeyboardInterrupt" in err
    deadline = time.monotonic() + 10
    while not _gone(fake_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(fake_pid)


def test_another_server_on_the_port_is_not_taken_for_azurite(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from azurite import launcher

    busy = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=busy.serve_forever, daemon=True).start()
    taken = busy.server_address[1]
    ports = iter([taken])
    real = launcher._free_port
    monkeypatch.setattr(launcher, "_free_port", lambda: next(ports, None) or real())
    try:
        with AzuriteTable(startup_timeout=15) as azurite:
            assert azurite.port != taken
            service = TableServiceClient.from_connection_string(azurite.connection_string)
            assert list(service.list_tables()) == []
    finally:
        busy.shutdown()
        busy.server_close()


def test_a_command_killed_by_a_signal_gives_128_plus_its_number() -> None:
    from azurite.launcher import main

    assert main(["--", "sh", "-c", "kill -TERM $$"]) == 128 + signal.SIGTERM
    assert main(["--", "sh", "-c", "exit 7"]) == 7


def test_serve_prints_the_export_line_and_stops_azurite_on_a_signal(tmp_path: Path) -> None:
    # Run by its path from another directory, with nothing of the repository
    # on the import path: as a user starts it beside their own project.
    launcher = subprocess.Popen(
        [sys.executable, str(ROOT / "azurite" / "launcher.py"), "--serve"],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert launcher.stdout is not None
    line = launcher.stdout.readline()
    assert line.startswith("export STREAMSTONE_CONNECTION_STRING='DefaultEndpointsProtocol=http;")
    connection_string = line.split("'")[1]
    assert ";QueueEndpoint=http://127.0.0.1:" in connection_string  # both services, one line
    QueueClient.from_connection_string(connection_string, "served").create_queue()
    service = TableServiceClient.from_connection_string(connection_string)
    service.create_table("served").create_entity({"PartitionKey": "p", "RowKey": "r"})
    port = int(connection_string.split("TableEndpoint=http://127.0.0.1:")[1].split("/")[0])

    launcher.send_signal(signal.SIGTERM)

    assert launcher.wait(timeout=60) == 128 + signal.SIGTERM
    launcher.stdout.close()
    assert not launcher_answers(port)


def test_serve_stops_on_ctrl_c_with_status_0_and_keeps_data_with_a_location(
    tmp_path: Path,
) -> None:
    # Ctrl-C is how `make azurite` is stopped: make must not report an error.
    data = tmp_path / "data"

    def serve() -> tuple[subprocess.Popen[str], TableServiceClient]:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "azurite.launcher", "--serve", "--location", str(data)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert launcher.stdout is not None
        connection_string = launcher.stdout.readline().split("'")[1]
        return launcher, TableServiceClient.from_connection_string(connection_string)

    launcher, service = serve()
    service.create_table("kept").create_entity({"PartitionKey": "p", "RowKey": "r", "n": 7})
    launcher.send_signal(signal.SIGINT)
    assert launcher.wait(timeout=60) == 0
    assert launcher.communicate()[1].splitlines()[-1] == "azurite: stopped"

    launcher, service = serve()  # another port, the same directory
    try:
        assert service.get_table_client("kept").get_entity("p", "r")["n"] == 7
    finally:
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(timeout=60) == 0
        launcher.communicate()


def test_serve_and_a_command_are_refused_together() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "azurite.launcher", "--serve", "--", "true"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "give either --serve or a command, not both" in done.stderr
