"""Start Azurite's Table service (and its Queue service) for tests, the demo
and the benchmarks.

Nobody starts Azurite by hand: this module installs nothing, but finds the
``azurite-table`` (and ``azurite-queue``) binary that ``npm ci --prefix
azurite`` put into ``azurite/node_modules``, starts it on a free loopback port
with telemetry off, waits until it answers HTTP, and stops it again. As a
command it runs both services, and the connection string names both
endpoints.

As a library::

    with AzuriteTable() as azurite:
        client = TableServiceClient.from_connection_string(azurite.connection_string)

As a command, it runs another command with ``STREAMSTONE_CONNECTION_STRING``
set and stops Azurite when that command ends::

    python -m azurite.launcher -- python examples/stream_walkthrough.py

For your own scripts and notebooks, ``make azurite`` (``--serve``) keeps one
running and prints the ``export`` line for your shell. The file needs only the
standard library, so ``python PATH/TO/azurite/launcher.py ...`` works from any
directory.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import http.client
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType, TracebackType
from typing import Literal

__all__ = ["CONNECTION_STRING_ENV", "AzuriteError", "AzuriteTable", "main"]

CONNECTION_STRING_ENV = "STREAMSTONE_CONNECTION_STRING"

# Azurite's fixed development account. The key is public (it is documented by
# Microsoft for every emulator); this module prints it only when asked to
# (``--serve`` prints the connection string for the user's shell).
_ACCOUNT = "devstoreaccount1"
_ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
_HOST = "127.0.0.1"
_BINARIES = Path(__file__).resolve().parent / "node_modules" / ".bin"
_BIN = _BINARIES / "azurite-table"
#: Each service Azurite runs for us: its binary, its host and port options,
#: the prefix of its ``Server`` header, and a path to ask it for.
_SERVICES = {
    "table": ("azurite-table", "--tableHost", "--tablePort", "Azurite-Table/", "/Tables"),
    "queue": ("azurite-queue", "--queueHost", "--queuePort", "Azurite-Queue/", "?comp=list"),
}


#: One of the services: ``stop`` and ``start`` take one, to stop it alone.
Service = Literal["table", "queue"]


class AzuriteError(RuntimeError):
    """Azurite could not be found, started or stopped."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        return int(sock.getsockname()[1])


def _answers(port: int, cert: Path | None = None, service: str = "table") -> bool:
    """True once Azurite's ``service`` answers on ``port`` (any status counts).

    Another HTTP server on the port does not count: the answer must name
    that Azurite service (its ``Server`` header). With ``cert``, over
    HTTPS, checked against that certificate.
    """
    _, _, _, server, path = _SERVICES[service]
    conn: http.client.HTTPConnection
    if cert is not None:
        context = ssl.create_default_context(cafile=str(cert))
        conn = http.client.HTTPSConnection(_HOST, port, timeout=1.0, context=context)
    else:
        conn = http.client.HTTPConnection(_HOST, port, timeout=1.0)
    try:
        conn.request("GET", f"/{_ACCOUNT}{path}")
        response = conn.getresponse()
        response.read()
        return (response.getheader("Server") or "").startswith(server)
    except OSError:
        return False
    finally:
        conn.close()


class AzuriteTable:
    """One Azurite Table service process on a free 127.0.0.1 port, and with
    ``queues=True`` its Queue service beside it on a port of its own.

    ``location=None`` keeps all data in memory; a directory keeps it on disk so
    that it survives :meth:`restart`. Use it as a context manager, or call
    :meth:`start` and :meth:`stop`; it is also stopped when the interpreter exits.
    """

    def __init__(
        self,
        *,
        location: str | os.PathLike[str] | None = None,
        startup_timeout: float = 60.0,
        binary: str | os.PathLike[str] | None = None,
        https: tuple[str | os.PathLike[str], str | os.PathLike[str]] | None = None,
        oauth: bool = False,
        queues: bool = False,
        _service: str = "table",
    ) -> None:
        if oauth and https is None:
            raise ValueError("Azurite takes bearer tokens over HTTPS only: give https=(cert, key)")
        #: The PEM certificate and key to serve HTTPS with (None: plain HTTP).
        self.https = (Path(https[0]), Path(https[1])) if https is not None else None
        #: Whether bearer tokens are accepted (Azurite checks their claims, not
        #: their signature: for tests of the client's side only).
        self.oauth = oauth
        self._service = _service
        self._binary = Path(binary) if binary is not None else _BINARIES / _SERVICES[_service][0]
        self._location = Path(location) if location is not None else None
        #: The Queue service beside this Table service (None: not asked for).
        self.queue: AzuriteTable | None = None
        if queues:
            self.queue = AzuriteTable(
                location=location, startup_timeout=startup_timeout, https=https, oauth=oauth,
                _service="queue",
            )  # fmt: skip
        self._startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self._log: Path | None = None
        self.port: int | None = None

    def __repr__(self) -> str:
        state = f"port={self.port}" if self.running else "stopped"
        return f"AzuriteTable({state})"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def endpoint(self) -> str:
        if self.port is None:
            raise AzuriteError("Azurite has not been started")
        scheme = "https" if self.https is not None else "http"
        return f"{scheme}://{_HOST}:{self.port}/{_ACCOUNT}"

    @property
    def connection_string(self) -> str:
        """The account's connection string: its Table endpoint, and its Queue
        endpoint when the Queue service runs beside it."""
        scheme = "https" if self.https is not None else "http"
        queue = f"QueueEndpoint={self.queue.endpoint};" if self.queue is not None else ""
        return (
            f"DefaultEndpointsProtocol={scheme};AccountName={_ACCOUNT};"
            f"AccountKey={_ACCOUNT_KEY};TableEndpoint={self.endpoint};{queue}"
        )

    def start(self, service: Service | None = None) -> AzuriteTable:
        """Start the services (on the same ports as before after a stop) and
        wait until they answer; ``service`` (``"table"`` or ``"queue"``)
        starts that one alone."""
        if service is not None:
            self._one(service)._start()
            return self
        self._start()
        if self.queue is not None:
            try:
                self.queue._start()
            except BaseException:
                self._terminate()
                raise
        return self

    def _one(self, service: Service) -> AzuriteTable:
        """The process of ``service``: this one's for tables, its queue's for queues."""
        if service == "table":
            return self
        if service == "queue" and self.queue is not None:
            return self.queue
        if service == "queue":
            raise AzuriteError("no Queue service runs beside this one: give queues=True")
        raise ValueError(f"service must be 'table' or 'queue', got {service!r}")

    def _start(self) -> None:
        if self.running:
            return
        if not self._binary.exists():
            raise AzuriteError(
                f"{self._binary} does not exist; install Azurite with "
                "'npm ci --prefix azurite' (make does this for you)"
            )
        if self._workdir is None:
            # Azurite writes its debug and extent files into its working directory.
            self._workdir = tempfile.TemporaryDirectory(prefix="azurite-")
        attempts = 1 if self.port is not None else 5
        last_error = ""
        # From before the spawn: a daemon thread still starting Azurite when the
        # interpreter exits (Ctrl-C in the main thread) leaves it to this. Once
        # per instance, however often it is restarted.
        atexit.unregister(self.stop)
        atexit.register(self.stop)
        try:
            for _ in range(attempts):
                # A port found free may be taken before Azurite binds it: then
                # Azurite exits (or another server answers) and a new port is tried.
                port = self.port if self.port is not None else _free_port()
                started, last_error = self._spawn(port)
                if started:
                    self.port = port
                    return
        except BaseException:
            self._terminate()  # Ctrl-C or a signal during start-up: no orphan
            raise
        raise AzuriteError(f"Azurite did not start: {last_error}")

    def _spawn(self, port: int) -> tuple[bool, str]:
        assert self._workdir is not None
        _, host, port_option, _, _ = _SERVICES[self._service]
        args = [
            str(self._binary),
            host, _HOST,
            port_option, str(port),
            "--skipApiVersionCheck",
            "--disableTelemetry",
            "--silent",
        ]  # fmt: skip
        if self.https is not None:
            args += ["--cert", str(self.https[0]), "--key", str(self.https[1])]
        if self.oauth:
            args += ["--oauth", "basic"]
        if self._location is None:
            args.append("--inMemoryPersistence")
        else:
            self._location.mkdir(parents=True, exist_ok=True)
            args += ["--location", str(self._location)]
        self._log = Path(self._workdir.name) / "azurite.log"
        with open(self._log, "ab") as log, _signals_held():
            self._process = subprocess.Popen(
                args,
                cwd=self._workdir.name,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # so stop() can end node and its children together
            )
        deadline = time.monotonic() + self._startup_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            # Our process must still be alive after the answer: an Azurite of
            # someone else's on this port would answer while ours failed to bind.
            cert = self.https[0] if self.https is not None else None
            if _answers(port, cert, self._service) and self._process.poll() is None:
                return True, ""
            time.sleep(0.1)
        output = self._log.read_text(errors="replace")[-2000:]
        self._terminate()
        return False, f"port {port}: {output.strip() or 'no answer in time'}"

    def _terminate(self) -> None:
        # The process is forgotten only once it is gone: a signal that cuts this
        # short leaves it to the next stop() (at exit at the latest).
        process = self._process
        if process is None:
            return
        # SIGINT is Azurite's graceful stop: it saves its on-disk database first.
        # SIGTERM ends it at once, losing the writes since its last autosave.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            if process.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        self._process = None

    def stop(self, service: Service | None = None) -> None:
        """Stop the services, or ``service`` (``"table"`` or ``"queue"``) alone,
        as an outage of that service: in-memory data is gone, on-disk data
        stays for :meth:`start`."""
        if service is not None:
            self._one(service)._terminate()
            return
        if self.queue is not None:
            self.queue._terminate()
        self._terminate()

    def restart(self) -> None:
        """Stop and start again on the same port (keeps data only with ``location``)."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop the service and remove its working directory."""
        if self.queue is not None:
            self.queue.close()
        self.stop()
        atexit.unregister(self.stop)
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def __enter__(self) -> AzuriteTable:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@contextlib.contextmanager
def account(*, queues: bool = False) -> Iterator[str]:
    """The connection string in ``STREAMSTONE_CONNECTION_STRING``, else a fresh
    Azurite's (with its Queue service too if ``queues``)."""
    given = os.environ.get(CONNECTION_STRING_ENV)
    if given:
        yield given
        return
    with AzuriteTable(queues=queues) as azurite:
        yield azurite.connection_string


class _Signalled(BaseException):
    """The launcher got SIGTERM or SIGHUP: unwind so that Azurite is stopped."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_signalled(signum: int, frame: object) -> None:
    raise _Signalled(signum)


_STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP while a child is spawned and its pid kept.

    Python raises a signal's exception at any bytecode: one raised inside
    ``Popen``, after the child started, unwinds before anyone holds its pid,
    and nobody stops that child. Held, the signal's own handler runs as the
    block ends, when the caller can stop the child.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # Python runs signal handlers in the main thread alone
        return
    held: list[int] = []
    handlers: dict[int, Callable[[int, FrameType | None], object]] = {}
    for sig in _STOPPING_SIGNALS:
        handler = signal.getsignal(sig)
        if callable(handler):  # SIG_DFL, SIG_IGN and C-level handlers stay as they are
            handlers[sig] = handler
            signal.signal(sig, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        late: list[BaseException] = []  # from signals that came as handlers went back
        for signum, handler in handlers.items():
            # A signal whose handler is already back runs it inside the next
            # signal.signal(), before that one's handler is put back: retry it.
            while signal.getsignal(signum) is not handler:
                try:
                    signal.signal(signum, handler)
                except BaseException as error:
                    late.append(error)
        raised: list[BaseException] = []
        for signum in dict.fromkeys(held):  # each signal's handler once, in order
            try:
                handlers[signum](signum, None)
            except BaseException as error:
                raised.append(error)
        if raised or late:  # the first signal decides how the caller unwinds
            raise (raised + late)[0]


def _exit_status(returncode: int) -> int:
    """A child killed by signal N exits as a shell reports it: 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _stop_child(child: subprocess.Popen[bytes], signum: int) -> int:
    """Pass the signal on, give the child a moment, then make sure it is gone:
    at once if another signal cuts the moment short."""
    try:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=10)
    finally:
        if child.returncode is None:
            child.kill()
    return child.wait()


def main(argv: list[str] | None = None) -> int:
    """Run a command beside a fresh Azurite; return the command's exit status.

    Azurite never outlives the launcher: SIGTERM, SIGHUP and Ctrl-C (during
    start-up too) stop the command and Azurite, and the launcher exits with
    128 + the signal's number, as does a command that a signal killed.
    """
    parser = argparse.ArgumentParser(
        prog="python -m azurite.launcher",
        description=f"Start Azurite, run COMMAND with {CONNECTION_STRING_ENV} set, stop Azurite.",
    )
    parser.add_argument("--location", help="keep data in this directory instead of memory")
    parser.add_argument(
        "--serve",
        action="store_true",
        help="run no command: print the export line for your shell, serve until Ctrl-C",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.serve and command:
        parser.error("give either --serve or a command, not both")
    if not command and not args.serve:
        parser.error("give a command to run after --, or --serve")
    if command and shutil.which(command[0]) is None and not Path(command[0]).exists():
        parser.error(f"command not found: {command[0]!r}")
    previous = {
        sig: signal.signal(sig, _raise_signalled) for sig in (signal.SIGTERM, signal.SIGHUP)
    }
    try:
        with AzuriteTable(location=args.location, queues=True) as azurite:
            assert azurite.queue is not None
            print(f"azurite: Table service on {azurite.endpoint}", file=sys.stderr)
            print(f"azurite: Queue service on {azurite.queue.endpoint}", file=sys.stderr)
            if args.serve:
                return _serve(azurite)
            env = dict(os.environ, **{CONNECTION_STRING_ENV: azurite.connection_string})
            child: subprocess.Popen[bytes] | None = None
            try:
                with _signals_held():
                    child = subprocess.Popen(command, env=env)
                return _exit_status(child.wait())
            except KeyboardInterrupt:
                if child is not None:
                    _stop_child(child, signal.SIGINT)
                return 128 + signal.SIGINT
            except _Signalled as signalled:
                if child is not None:
                    _stop_child(child, signalled.signum)
                return 128 + signalled.signum
            finally:
                print("azurite: stopped", file=sys.stderr)
    except KeyboardInterrupt:  # during start-up: Azurite was stopped on the way out
        return 128 + signal.SIGINT
    except _Signalled as signalled:
        return 128 + signalled.signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _serve(azurite: AzuriteTable) -> int:
    """Print the line that points a shell at this Azurite, then wait for a signal."""
    print(f"export {CONNECTION_STRING_ENV}='{azurite.connection_string}'", flush=True)
    print("azurite: serving until Ctrl-C", file=sys.stderr, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:  # the way to stop it: not a failure
        print("azurite: stopped", file=sys.stderr)
        return 0
    except _Signalled as signalled:
        print("azurite: stopped", file=sys.stderr)
        return 128 + signalled.signum


if __name__ == "__main__":
    sys.exit(main())
