"""The launcher and a signal that comes at a bad moment: as a child is
spawned, as Azurite is stopped, a second one, one among a caller's own
handlers. Each runs a Python of its own whose functions take the signal at
that moment, and checks that no process outlives it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_launcher import (
    CHILD,
    ROOT,
    _gone,
    _wait_for,
    ctrl_c_as_a_terminal_gives_it,  # noqa: F401 (autouse here too)
    launcher_answers,
)

# Runs in a Python of its own: its Popen, once the child runs, takes a signal
# before it returns (as a Ctrl-C or SIGTERM can come at any bytecode) and
# writes the child's pid for the test to check.
SIGNAL_AS_POPEN_RETURNS = """
import os, signal, subprocess, sys
from azurite import launcher

real = subprocess.Popen
pid_file, target, signum = sys.argv[1], sys.argv[2], int(sys.argv[3])

class SignalledOnReturn(real):
    def __init__(self, args, *rest, **options):
        super().__init__(args, *rest, **options)
        if os.path.basename(str(args[0])) == target:
            with open(pid_file + ".tmp", "w") as out:
                out.write(f"{self.pid}\\n")
            os.rename(pid_file + ".tmp", pid_file)
            signal.raise_signal(signum)

subprocess.Popen = SignalledOnReturn
"""


def test_ctrl_c_as_azurite_is_spawned_leaves_no_process(tmp_path: Path) -> None:
    """A signal inside Popen, after the child started, used to unwind before
    the launcher kept its pid: the child was left running with nobody to stop it."""
    pid_file = tmp_path / "pid"
    fake = tmp_path / "azurite-table"
    fake.write_text("#!/bin/sh\nexec sleep 120\n")
    fake.chmod(0o755)
    script = SIGNAL_AS_POPEN_RETURNS + (
        f"launcher.AzuriteTable(binary={str(fake)!r}, startup_timeout=120).start()\n"
    )
    # A file, not a pipe: a child left running would hold a pipe open.
    with open(tmp_path / "err", "w") as err:
        subprocess.run(
            [sys.executable, "-c", script, str(pid_file), fake.name, str(int(signal.SIGINT))],
            cwd=ROOT, stderr=err, timeout=60,
        )  # fmt: skip
    assert "KeyboardInterrupt" in (tmp_path / "err").read_text()
    fake_pid = int(_wait_for(pid_file, timeout=5))
    deadline = time.monotonic() + 10
    while not _gone(fake_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(fake_pid)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_as_the_command_is_spawned_stops_it_and_azurite(
    tmp_path: Path, sig: signal.Signals
) -> None:
    pid_file = tmp_path / "pid"
    script = SIGNAL_AS_POPEN_RETURNS + "sys.exit(launcher.main(['--', 'sleep', '120']))\n"
    with open(tmp_path / "err", "w") as err:  # a file: the command may hold a pipe open
        launcher = subprocess.run(
            [sys.executable, "-c", script, str(pid_file), "sleep", str(int(sig))],
            cwd=ROOT, stderr=err, timeout=60,
        )  # fmt: skip
    stderr = (tmp_path / "err").read_text()
    assert launcher.returncode == 128 + sig, stderr
    command_pid = int(_wait_for(pid_file, timeout=5))
    assert _gone(command_pid)
    port = int(stderr.split("Table service on http://127.0.0.1:")[1].split("/")[0])
    assert not launcher_answers(port)


# --- A second signal, a signal while stopping, a caller's own handlers ------------------


def _pids_gone(pid_file: Path) -> list[int]:
    """The pids in ``pid_file`` still running after a moment (and now killed)."""
    pids = [int(pid) for pid in pid_file.read_text().split()]
    deadline = time.monotonic() + 10
    while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [pid for pid in pids if not _gone(pid)]
    for pid in alive:  # leave nothing behind for the next test
        os.killpg(pid, signal.SIGKILL)
    return alive


def test_a_second_sigterm_while_the_command_is_given_time_still_stops_it(
    tmp_path: Path,
) -> None:
    """The command takes its time over SIGTERM; a second SIGTERM used to cut
    the launcher's wait short and leave the command running."""
    ready, told = tmp_path / "ready", tmp_path / "told"
    slow = CHILD.replace(
        "import os, sys, time",
        "import os, signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *_: open({str(told)!r}, 'w').write('\\n'))",
    )
    launcher = subprocess.Popen(
        [sys.executable, "-m", "azurite.launcher", "--", sys.executable, "-c", slow, str(ready)],
        cwd=ROOT, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    pid = int(_wait_for(ready).split()[0])
    launcher.send_signal(signal.SIGTERM)
    _wait_for(told, timeout=10)  # the command has it, and goes on sleeping

    launcher.send_signal(signal.SIGTERM)

    assert launcher.wait(timeout=30) == 128 + signal.SIGTERM
    (tmp_path / "pids").write_text(f"{pid}\n")
    assert _pids_gone(tmp_path / "pids") == []


# Runs in a Python of its own: a signal comes as the launcher is about to stop
# one of the Azurite processes (it writes the pids it stops).
SIGNAL_AS_AZURITE_IS_STOPPED = """
import os, signal, sys
from azurite import launcher

real = os.killpg
pid_file, signum = sys.argv[1], int(sys.argv[2])

def signalled_first(pid, sig, first=[True]):
    with open(pid_file, "a") as out:
        out.write(f"{pid}\\n")
    if first:
        first.clear()
        signal.raise_signal(signum)
    real(pid, sig)

os.killpg = signalled_first
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_as_azurite_is_stopped_still_stops_it(tmp_path: Path, sig: signal.Signals) -> None:
    pid_file = tmp_path / "pids"
    script = SIGNAL_AS_AZURITE_IS_STOPPED + "sys.exit(launcher.main(['--', 'true']))\n"
    launcher = subprocess.run(
        [sys.executable, "-c", script, str(pid_file), str(int(sig))],
        cwd=ROOT, stderr=subprocess.DEVNULL, timeout=60,
    )  # fmt: skip
    assert launcher.returncode == 128 + sig
    assert _pids_gone(pid_file) == []


def _fake_azurite(tmp_path: Path) -> Path:
    """A binary that starts and never answers: start-up goes on until a signal."""
    fake = tmp_path / "azurite-table"
    fake.write_text(f'#!/bin/sh\necho "$$" >> {tmp_path / "pids"}\nexec sleep 120\n')
    fake.chmod(0o755)
    return fake


def test_every_held_signal_reaches_the_callers_handler_once(tmp_path: Path) -> None:
    """A SIGTERM (to the caller's handler, which does not raise) and a Ctrl-C
    held together: the Ctrl-C used to be dropped, and start-up went on."""
    fake = _fake_azurite(tmp_path)
    script = SIGNAL_AS_POPEN_RETURNS.replace(
        "signal.raise_signal(signum)",
        "signal.raise_signal(signal.SIGTERM)\n            signal.raise_signal(signum)",
    ) + (
        "calls = []\n"
        "signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))\n"
        "try:\n"
        f"    launcher.AzuriteTable(binary={str(fake)!r}, startup_timeout=5).start()\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', calls)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "pid"), fake.name, str(int(signal.SIGINT))],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=60,
    )  # fmt: skip
    assert done.stdout == f"interrupted [{int(signal.SIGTERM)}]\n"
    assert _pids_gone(tmp_path / "pid") == []


def test_a_ctrl_c_as_the_handlers_are_put_back_leaves_the_callers_in_place(
    tmp_path: Path,
) -> None:
    """A Ctrl-C once SIGINT's handler is back used to leave SIGTERM's holder
    installed for good: the caller's SIGTERM handler never ran again."""
    fake = _fake_azurite(tmp_path)
    script = (
        "import signal\n"
        "from azurite import launcher\n"
        "real = signal.signal\n"
        "def put_back(sig, handler):\n"
        "    old = real(sig, handler)\n"
        "    if sig == signal.SIGINT and handler is signal.default_int_handler:\n"
        "        signal.raise_signal(signal.SIGINT)\n"
        "    return old\n"
        "signal.signal = put_back\n"
        "mine = lambda signum, frame: print('mine', signum)\n"
        "real(signal.SIGTERM, mine)\n"
        "try:\n"
        f"    launcher.AzuriteTable(binary={str(fake)!r}, startup_timeout=5).start()\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', signal.getsignal(signal.SIGTERM) is mine)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True, timeout=60,
    )  # fmt: skip
    assert done.stdout == "interrupted True\n"


def test_ctrl_c_while_a_daemon_thread_starts_azurite_leaves_no_process(tmp_path: Path) -> None:
    fake = _fake_azurite(tmp_path)
    script = (
        "import threading, time\n"
        "from azurite.launcher import AzuriteTable\n"
        f"starting = AzuriteTable(binary={str(fake)!r}, startup_timeout=120)\n"
        "threading.Thread(target=starting.start, daemon=True).start()\n"
        "time.sleep(120)\n"
    )
    starting = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stderr=subprocess.DEVNULL)
    _wait_for(tmp_path / "pids", timeout=30)

    starting.send_signal(signal.SIGINT)

    starting.wait(timeout=30)
    assert _pids_gone(tmp_path / "pids") == []
