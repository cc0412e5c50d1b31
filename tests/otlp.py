"""An OTLP/HTTP receiver on a loopback port, for the tests that check what an
exporter sends: each request's body kept by path, decoded with
``opentelemetry-proto``; it answers every export with an empty success."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

__all__ = ["Received", "Span", "receiving"]


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: int
    span_id: int
    parent_span_id: int | None
    attributes: dict[str, Any]
    #: Its resource's attributes (``service.name``...).
    resource: dict[str, Any]


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return None if kind is None else getattr(any_value, kind)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


@dataclass
class Received:
    url: str
    bodies: list[tuple[str, bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _of(self, path: str) -> list[bytes]:
        with self.lock:
            return [body for at, body in self.bodies if at == path]

    def spans(self) -> list[Span]:
        found = []
        for body in self._of("/v1/traces"):
            request = ExportTraceServiceRequest.FromString(body)
            for resource_spans in request.resource_spans:
                resource = _attributes(resource_spans.resource.attributes)
                for scope in resource_spans.scope_spans:
                    for s in scope.spans:
                        parent = int.from_bytes(s.parent_span_id, "big") or None
                        found.append(Span(s.name, int.from_bytes(s.trace_id, "big"),
                                          int.from_bytes(s.span_id, "big"), parent,
                                          _attributes(s.attributes), resource))  # fmt: skip
        return found

    def sums(self, name: str, key: str) -> dict[Any, int]:
        """A counter's total by one attribute's value: each process exports its
        cumulative stream (known by its start time) again at each flush, so
        the last value of each stream counts."""
        last: dict[tuple[Any, ...], int] = {}
        for body in self._of("/v1/metrics"):
            request = ExportMetricsServiceRequest.FromString(body)
            for resource_metrics in request.resource_metrics:
                for scope in resource_metrics.scope_metrics:
                    for metric in scope.metrics:
                        if metric.name != name:
                            continue
                        for point in metric.sum.data_points:
                            attributes = _attributes(point.attributes)
                            stream = (point.start_time_unix_nano, tuple(sorted(attributes.items())))
                            last[stream] = max(last.get(stream, 0), point.as_int)
        totals: dict[Any, int] = {}
        for (_, attributes), value in last.items():
            at = dict(attributes).get(key)
            totals[at] = totals.get(at, 0) + value
        return totals


@contextmanager
def receiving() -> Iterator[Received]:
    """A receiver on 127.0.0.1, a free port; stopped on leaving."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    received = Received(f"http://127.0.0.1:{server.server_address[1]}")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with received.lock:
                received.bodies.append((self.path, body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the test reads what came, not a line per request

    server.RequestHandlerClass = Handler
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield received
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
