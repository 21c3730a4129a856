"""A tiny OTLP/HTTP receiver for tests: decodes spans and metrics with opentelemetry-proto."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


class Received:
    """What the receiver decoded: spans by name, metric data points by metric name."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[Any] = []
        self.metrics: dict[str, list[Any]] = {}
        self.traceparents: list[str] = []

    def add_traces(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        with self.lock:
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    self.spans.extend(scope.spans)

    def add_metrics(self, body: bytes) -> None:
        request = ExportMetricsServiceRequest.FromString(body)
        with self.lock:
            for resource in request.resource_metrics:
                for scope in resource.scope_metrics:
                    for metric in scope.metrics:
                        self.metrics.setdefault(metric.name, []).append(metric)


def _handler(received: Received) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            if self.path == "/v1/traces":
                received.add_traces(body)
                reply = ExportTraceServiceResponse().SerializeToString()
            elif self.path == "/v1/metrics":
                received.add_metrics(body)
                reply = ExportMetricsServiceResponse().SerializeToString()
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, Received]]:
    """Serve OTLP/HTTP on 127.0.0.1 (a free port); yield its base URL and what it received."""
    received = Received()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(received))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
