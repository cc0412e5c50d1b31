"""Deadlines for the sync wire client's requests, answers included.

urllib3 times each socket operation, not a request: an answer that trickles
in (a byte every 50 ms) never lets one read time out, and held a call for as
long as it trickled. Here a watchdog thread shuts the socket of a request
that is still unanswered at its deadline, so its read fails at once; the
client then raises ``ServiceResponseTimeoutError``, a lost answer (for a
write, the engine resolves it by reading).

The connection a request runs on is known to its watch only between the
request and the connection's return to its pool, under one lock, so a late
watchdog never shuts a connection that serves another request.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from typing import Any, Final

from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

__all__ = ["POOL_CLASSES", "Watch", "watching"]


class Watch:
    """One request's deadline, and the connection it runs on."""

    __slots__ = ("connection", "deadline", "fired")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.connection: Any = None
        self.fired = False


class _Watchdog:
    """One thread per process that shuts the sockets of overdue requests."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        self.active: set[Watch] = set()
        self.next_wake = float("inf")
        self.thread: threading.Thread | None = None

    def arm(self, deadline: float) -> Watch:
        watch = Watch(deadline)
        with self.lock:
            self.active.add(watch)
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._run, name="streamstone-deadlines", daemon=True
                )
                self.thread.start()
            if deadline < self.next_wake:
                self.wake.notify()
        return watch

    def disarm(self, watch: Watch) -> None:
        with self.lock:
            self.active.discard(watch)
            watch.connection = None

    def _run(self) -> None:
        with self.lock:
            while True:
                now = time.monotonic()
                for watch in [w for w in self.active if w.deadline <= now]:
                    self.active.discard(watch)
                    watch.fired = True
                    _shut(watch.connection)
                self.next_wake = min((w.deadline for w in self.active), default=float("inf"))
                self.wake.wait(None if not self.active else self.next_wake - now)


def _shut(connection: Any) -> None:
    """End the connection's socket now (the base class's shutdown: an SSL
    socket's own would unwrap it under the reading thread)."""
    sock = getattr(connection, "sock", None)
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):  # closed already
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


_watchdog = _Watchdog()
_current: Final = threading.local()


def _forget_in_child() -> None:
    # A forked child has the watchdog's objects but not its thread, and its
    # lock may have been held at the fork: start again.
    global _watchdog
    _watchdog = _Watchdog()
    _current.__dict__.clear()


os.register_at_fork(after_in_child=_forget_in_child)


class watching:
    """``with watching(deadline) as watch:`` the requests this thread sends
    inside end by ``deadline`` (``time.monotonic()`` clock)."""

    def __init__(self, deadline: float) -> None:
        self.watch = _watchdog.arm(deadline)

    def __enter__(self) -> Watch:
        _current.watch = self.watch
        return self.watch

    def __exit__(self, *exc: object) -> None:
        _current.watch = None
        _watchdog.disarm(self.watch)


class _Watched:
    """A connection that its thread's watch may shut."""

    sock: Any

    def request(self, *args: Any, **kwargs: Any) -> None:
        watch: Watch | None = getattr(_current, "watch", None)
        if watch is not None:
            with _watchdog.lock:
                watch.connection = self
                if watch.fired:
                    _shut(self)
        super().request(*args, **kwargs)  # type: ignore[misc]

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        watch: Watch | None = getattr(_current, "watch", None)
        if watch is not None:
            with _watchdog.lock:
                if watch.fired and watch.connection is self:
                    _shut(self)  # it fired while this connection was being made


class _Connection(_Watched, HTTPConnection):
    pass


class _TlsConnection(_Watched, HTTPSConnection):
    pass


def _release(connection: Any) -> None:
    """Back to the pool: no watch may shut it from now on."""
    watch: Watch | None = getattr(_current, "watch", None)
    if watch is not None:
        with _watchdog.lock:
            if watch.connection is connection:
                watch.connection = None


class _Pool(HTTPConnectionPool):
    ConnectionCls = _Connection

    def _put_conn(self, conn: Any) -> None:
        _release(conn)
        super()._put_conn(conn)


class _TlsPool(HTTPSConnectionPool):
    ConnectionCls = _TlsConnection

    def _put_conn(self, conn: Any) -> None:
        _release(conn)
        super()._put_conn(conn)


#: ``PoolManager.pool_classes_by_scheme`` for connections a watch can end.
POOL_CLASSES: Final[dict[str, type[HTTPConnectionPool]]] = {"http": _Pool, "https": _TlsPool}
