"""A TCP proxy in front of Azurite that adds latency or breaks requests on a real socket.

The tests use it to meet the faults real transports raise (a connection
dropped after the server applied a request, a response cut after its
headers, a server that never answers), rather than exceptions built by hand;
the benchmarks use it to add network latency. It understands just enough
HTTP/1.1 to tell one request and its response from the next on a kept-alive
connection (``Content-Length`` and chunked bodies).

    with Proxy(upstream_port, delay=0.005) as proxy:      # 5 ms each way
        ...  # point the client at proxy.port

    proxy.plan(lambda request: "drop" if b"$batch" in request.head else "pass")

Actions a plan returns for each request:

- ``"pass"``: forward it and its response;
- ``"refuse"``: close the client's connection before forwarding (nothing applied);
- ``"drop"``: forward it, read the whole response, then close the client's
  connection without answering (applied, but the client cannot know);
- ``"truncate"``: forward it, then send the response's head and half of its
  body, and close (applied; the client sees a cut response);
- ``"behead"``: forward it, then send the response's status line and first
  header only, and close (applied; the answer ends amid its headers, before
  the ``ETag``, which HTTP/1.1 clients may take for the end of the headers);
- ``"hang"``: forward nothing and never answer, until the client gives up;
- ``"throttle"``: forward nothing and answer ``503 Server Busy`` with
  ``Retry-After: {retry_after}`` (nothing applied), as the service does when
  it throttles an account or a partition; with ``retry_after_date=True`` the
  header is the other form HTTP allows, the date ``retry_after`` seconds ahead;
- ``"trickle"``: forward it, read the whole response, then send it on one
  byte every ``trickle`` seconds (applied; a slow network or a stalled peer
  that never lets a socket read time out).

``max_body``, when given, is the service's limit of a request body: a larger
request is answered ``413 Request Entity Too Large`` (``RequestBodyTooLarge``)
and not forwarded, as Azure answers an entity-group transaction over 4 MiB
(Azurite does not check it). ``connections`` counts the connections accepted.
"""

from __future__ import annotations

import contextlib
import email.utils
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

__all__ = ["Action", "Proxy", "Request"]

Action = Literal["pass", "refuse", "drop", "truncate", "behead", "hang", "throttle", "trickle"]
_HOST = "127.0.0.1"


@dataclass(frozen=True)
class Request:
    """One HTTP request as the proxy saw it: its head (request line and headers) and body."""

    head: bytes
    body: bytes

    @property
    def method(self) -> str:
        return self.head.split(b" ", 1)[0].decode("ascii", "replace")


class _Closed(Exception):
    """The peer closed the connection."""


class _Reader:
    """Reads HTTP messages from a socket, keeping what arrives beyond one message."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise _Closed
        self.buffer += data

    def _take(self, n: int) -> bytes:
        while len(self.buffer) < n:
            self._fill()
        taken, self.buffer = self.buffer[:n], self.buffer[n:]
        return taken

    def _line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            self._fill()
        line, _, self.buffer = self.buffer.partition(b"\r\n")
        return line + b"\r\n"

    def message(self) -> tuple[bytes, bytes]:
        """The next message's head (with its blank line) and its body, as sent."""
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        head += b"\r\n\r\n"
        headers = {
            k.strip().lower(): v.strip()
            for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")[1:] if line)
        }
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            body = b""
            while True:
                size_line = self._line()
                size = int(size_line.split(b";")[0], 16)
                body += size_line + self._take(size + 2)
                if size == 0:
                    break
            return head, body
        return head, self._take(int(headers.get(b"content-length", b"0")))


class Proxy:
    """Listens on a free loopback port and forwards to ``upstream_port``.

    ``delay`` seconds are added before each request is forwarded and before
    each response is returned (so a round trip gains ``2 * delay``).
    """

    def __init__(
        self,
        upstream_port: int,
        *,
        delay: float = 0.0,
        retry_after: int = 1,
        retry_after_date: bool = False,
        trickle: float = 0.05,
        max_body: int | None = None,
    ) -> None:
        self.upstream_port = upstream_port
        self.delay = delay
        self.retry_after = retry_after
        self.retry_after_date = retry_after_date
        self.trickle = trickle
        self.max_body = max_body
        self.connections = 0
        self.seen: list[tuple[Request, Action]] = []
        self._plan: Callable[[Request], Action] = lambda request: "pass"
        self._lock = threading.Lock()
        self._listener = socket.create_server((_HOST, 0))
        self.port = int(self._listener.getsockname()[1])
        self._open: set[socket.socket] = set()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="proxy", daemon=True)

    def plan(self, decide: Callable[[Request], Action]) -> None:
        """Decide the action for each request from now on."""
        with self._lock:
            self._plan = decide

    def endpoint_of(self, connection_string: str) -> str:
        """``connection_string`` with its table endpoint moved to this proxy."""
        return connection_string.replace(f":{self.upstream_port}/", f":{self.port}/")

    def start(self) -> Proxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        _close(self._listener)  # a shutdown, not just a close, wakes the blocked accept()
        with self._lock:
            for sock in list(self._open):
                _close(sock)
        self._thread.join(timeout=5)

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _track(self, *socks: socket.socket) -> None:
        with self._lock:
            self._open.update(socks)

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            upstream = socket.create_connection((_HOST, self.upstream_port))
            self._track(client, upstream)
            from_client, from_upstream = _Reader(client), _Reader(upstream)
            while not self._stopped.is_set():
                head, body = from_client.message()
                request = Request(head, body)
                with self._lock:
                    action = self._plan(request)
                    self.seen.append((request, action))
                if action == "refuse":
                    return
                if action == "hang":
                    self._stopped.wait()
                    return
                if action == "throttle":
                    client.sendall(_busy(self._retry_after()))
                    continue
                if self.max_body is not None and len(body) > self.max_body:
                    client.sendall(_too_large())
                    continue
                if self.delay:
                    time.sleep(self.delay)
                upstream.sendall(head + body)
                response_head, response_body = from_upstream.message()
                if action == "drop":
                    return
                if self.delay:
                    time.sleep(self.delay)
                if action == "truncate":
                    client.sendall(response_head + response_body[: len(response_body) // 2])
                    return
                if action == "behead":
                    status, first, _ = response_head.split(b"\r\n", 2)
                    client.sendall(status + b"\r\n" + first + b"\r\n")
                    return
                if action == "trickle":
                    self._trickle(client, response_head + response_body)
                    continue
                client.sendall(response_head + response_body)
        except (_Closed, OSError):
            return
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    _close(sock)
                    with self._lock:
                        self._open.discard(sock)

    def _retry_after(self) -> str:
        if self.retry_after_date:
            return email.utils.formatdate(time.time() + self.retry_after, usegmt=True)
        return str(self.retry_after)

    def _trickle(self, client: socket.socket, answer: bytes) -> None:
        """Send ``answer`` a byte at a time, until it is sent, the client hangs up
        or the proxy stops."""
        for index in range(len(answer)):
            if self._stopped.wait(self.trickle):
                raise _Closed
            client.sendall(answer[index : index + 1])


def _answer(status: str, code: str, message: str, extra: str = "") -> bytes:
    """An error answer of the service: its status, its error code and message."""
    body = (
        f'{{"odata.error":{{"code":"{code}","message":{{"lang":"en-US","value":"{message}"}}}}}}'
    ).encode("ascii")
    head = (
        f"HTTP/1.1 {status}\r\n"
        "Content-Type: application/json;odata=minimalmetadata;charset=utf-8\r\n"
        f"x-ms-error-code: {code}\r\n"
        f"x-ms-request-id: {uuid.uuid4()}\r\n"
        f"{extra}"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


def _busy(retry_after: str) -> bytes:
    """The service's answer when it throttles: 503, ServerBusy, and when to come back."""
    return _answer(
        "503 Server Busy", "ServerBusy", "The server is busy.", f"Retry-After: {retry_after}\r\n"
    )


def _too_large() -> bytes:
    """The service's answer to a request body over its limit (4 MiB for a transaction)."""
    return _answer(
        "413 Request Entity Too Large",
        "RequestBodyTooLarge",
        "The request body is too large and exceeds the maximum permissible limit.",
    )


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
