"""The Prometheus endpoint: the run's OpenTelemetry metrics, served by prometheus-client.

Design note. The metrics are kept once, by the OpenTelemetry SDK; `_Bridge` is a
prometheus-client `Collector` that reads them from an `InMemoryMetricReader` (cumulative) at
each scrape and renders them as Prometheus families: a monotonic sum as a counter (``_total``),
any other sum or gauge as a gauge, a histogram as a histogram (``_bucket``, ``_sum``,
``_count``). Names are the instrument's with dots as underscores and a ``_seconds`` suffix for
``s`` units (``trollout.attempt.duration`` -> ``trollout_attempt_duration_seconds``).

What is served (`Exposition`): the bridge; ``trollout_run_info{run_id, version} 1`` once the
run has an id (an info metric, so a dashboard can join on the run); and, on the endpoint only,
prometheus-client's standard collectors (``process_*``, ``python_gc_*``, ``python_info``: what
its default registry carries and what dashboards expect of a Python target). They are not
pushed: a Pushgateway keeps a pushed group for ever, and the CPU and memory of a process that
has exited describe nothing a scraper can use.

The server (`MetricsServer`) is the standard library's WSGI server in daemon threads, bound to
127.0.0.1 unless told otherwise, with prometheus-client's WSGI app behind a path check: only
``/metrics`` is answered, anything else is 404. prometheus-client answers every path (for
backwards compatibility, says its source), so a scrape job with a mistyped ``metrics_path``
would get 200 and look healthy. A scrape never touches the event loop.

The end of a run: freeze, then linger or push. A run's last counts used to be lost: the
endpoint closed with the run, so the last scrape (up to a scrape interval earlier) missed the
final outcomes, ``in_flight`` stayed at its last value, and ``up`` went to 0. Now, when the run
ends (`Exposition.freeze`, from `runtime.open_telemetry`'s exit: the engine has stopped, every
outcome is counted, ``in_flight`` is 0), the bridge takes one last collection and serves that
from then on, so every later scrape sees the same final values whatever the process does next
(aggregation, the health check, the summary) and the SDK can shut down. Then:

- the endpoint keeps serving for ``metrics_linger_s`` seconds counted from the freeze
  (`MetricsServer.start_linger`). A scrape must fall in that window, so the default is one
  scrape interval at Prometheus's own default (``scrape_interval``, default 1m in Prometheus's
  configuration reference; the example prometheus.yml sets 15s, which 60 s covers 4 times).
  The process must stay alive meanwhile: `MetricsServer.linger` waits out the rest of the
  window and closes; SIGINT or SIGTERM (Ctrl-C) end it at once, as does cancellation. The run
  layer calls it last (`runtime.Telemetry.linger`), after the summary is printed, so the user
  sees the summary at once. A timer closes the endpoint at the end of the window even if no
  one calls `linger` (a library caller), so an endpoint never outlives its run by more;
- with ``metrics_pushgateway`` set, the frozen values are pushed once (`Exposition.push`: a
  PUT of job ``trollout``, grouped by ``run_id``, so shards of one job and resumed runs do not
  replace each other's groups), whether or not an endpoint is served.

Rejected alternatives: a second set of prometheus-client instruments fed beside the OTel ones
(every event counted twice, and the two views could disagree); lingering inside
``open_telemetry``'s exit (the summary would wait for the linger, and the numbers served
during aggregation would be a collection in progress); waiting the linger from the moment
`linger` is called rather than from the freeze (the guarantee a scraper needs is the length of
the window serving final values; time spent aggregating already counts towards it).
"""

from __future__ import annotations

import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import trio
from opentelemetry.sdk.metrics.export import (
    Gauge,
    Histogram,
    InMemoryMetricReader,
    Metric,
    MetricsData,
    Sum,
)
from prometheus_client import (
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    make_wsgi_app,
    push_to_gateway,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.core import (
    Metric as PromMetric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from .._version import __version__
from ..errors import ConfigError

__all__ = ["PUSH_JOB", "Exposition", "MetricsServer", "prometheus_name"]

PUSH_JOB = "trollout"  # the Pushgateway's job label
_PATH = "/metrics"
_INVALID = re.compile(r"[^a-zA-Z0-9_:]")


def prometheus_name(name: str, unit: str | None) -> str:
    """Return an instrument's Prometheus name (dots to underscores, seconds suffixed)."""
    base = _INVALID.sub("_", name)
    return base + "_seconds" if unit == "s" else base


class _Bridge(Collector):
    """Renders the reader's metrics as Prometheus families: live, or as frozen at the end."""

    def __init__(self, reader: InMemoryMetricReader) -> None:
        self.reader = reader
        self.frozen: MetricsData | None = None  # the last collection, once the run has ended

    def collect(self) -> Iterator[PromMetric]:
        data = self.frozen if self.frozen is not None else self.reader.get_metrics_data()
        for resource_metrics in data.resource_metrics if data is not None else ():
            for scope in resource_metrics.scope_metrics:
                for metric in scope.metrics:
                    family = _family(metric)
                    if family is not None:
                        yield family


class _RunInfo(Collector):
    """``trollout_run_info{run_id, version} 1``, once the run id is known."""

    def __init__(self) -> None:
        self.run_id: str | None = None

    def collect(self) -> Iterator[PromMetric]:
        if self.run_id is not None:
            yield InfoMetricFamily(
                "trollout_run",
                "The run this process collects, and trollout's version",
                value={"run_id": self.run_id, "version": __version__},
            )


def _family(metric: Metric) -> PromMetric | None:
    name = prometheus_name(metric.name, metric.unit)
    data = metric.data
    points: list[Any] = list(data.data_points)
    doc = metric.description or ""
    keys = sorted({key for point in points for key in point.attributes})
    family: Any
    if isinstance(data, Histogram):
        family = HistogramMetricFamily(name, doc, labels=keys)
        for point in points:
            cumulative, buckets = 0, []
            for bound, count in zip(point.explicit_bounds, point.bucket_counts, strict=False):
                cumulative += count
                buckets.append((_bound(bound), cumulative))
            buckets.append(("+Inf", point.count))
            family.add_metric(_values(point.attributes, keys), buckets, point.sum)
        return family  # type: ignore[no-any-return]
    if isinstance(data, Sum) and data.is_monotonic:
        family = CounterMetricFamily(name, doc, labels=keys)
    elif isinstance(data, Sum | Gauge):
        family = GaugeMetricFamily(name, doc, labels=keys)
    else:  # pragma: no cover - exponential histograms are never configured here
        return None
    for point in points:
        family.add_metric(_values(point.attributes, keys), point.value)
    return family  # type: ignore[no-any-return]


def _bound(bound: float) -> str:
    return repr(float(bound))


def _values(attributes: Any, keys: list[str]) -> list[str]:
    return [str(attributes.get(key, "")) for key in keys]


class Exposition:
    """The run's metrics as Prometheus sees them (module docstring: what, and the freeze).

    Attributes:
        pushed: what a push sends: the bridge and the run info.
        served: what the endpoint serves: those and the standard process collectors.
    """

    def __init__(self, reader: InMemoryMetricReader) -> None:
        self._bridge = _Bridge(reader)
        self._info = _RunInfo()
        self.pushed = CollectorRegistry(auto_describe=False)
        self.served = CollectorRegistry(auto_describe=False)
        for registry in (self.pushed, self.served):
            registry.register(self._bridge)
            registry.register(self._info)
        ProcessCollector(registry=self.served)
        PlatformCollector(registry=self.served)
        GCCollector(registry=self.served)

    @property
    def run_id(self) -> str | None:
        """The run's id (``trollout_run_info``), None until the run folder gives it."""
        return self._info.run_id

    @run_id.setter
    def run_id(self, value: str | None) -> None:
        self._info.run_id = value

    def freeze(self) -> None:
        """Take the last collection and serve it from now on (call once the run has ended)."""
        if self._bridge.frozen is None:
            self._bridge.frozen = self._bridge.reader.get_metrics_data()

    def push(self, gateway: str, *, timeout_s: float) -> None:
        """PUT the run's metrics to a Pushgateway, grouped by run id (blocking).

        Raises:
            OSError: the gateway cannot be reached or refused the push.
        """
        grouping = {"run_id": self.run_id} if self.run_id is not None else None
        push_to_gateway(
            gateway, job=PUSH_JOB, registry=self.pushed, grouping_key=grouping, timeout=timeout_s
        )


def _only_metrics(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """Wrap prometheus-client's WSGI app: ``/metrics`` goes to it, any other path is 404."""

    def only_metrics(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("PATH_INFO") == _PATH:
            return app(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"404 Not Found\n"]

    return only_metrics


class _Quiet(WSGIRequestHandler):
    """Logs no request (a scrape every few seconds is not news)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


class MetricsServer:
    """A Prometheus endpoint serving `registry` at ``http://host:port/metrics``, nowhere else.

    Raises:
        ConfigError: the address cannot be bound (in use, or not an address of this host).
    """

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        try:
            family = socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0][0]
            server_class = type("_Server", (_ThreadingWSGIServer,), {"address_family": family})
            self._server: WSGIServer = make_server(
                host, port, _only_metrics(make_wsgi_app(registry)), server_class, _Quiet
            )
        except OSError as exc:
            raise ConfigError(
                f"the Prometheus endpoint cannot listen on {host}:{port} ({exc.strerror or exc}); "
                "pass another --metrics-port (0 picks a free one) or --metrics-host"
            ) from exc
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="trollout-prometheus", daemon=True
        )
        self._thread.start()
        self.host = host
        self.port: int = self._server.server_port
        self._lock = threading.Lock()
        self._closed = False
        self._until: float | None = None  # time.monotonic() when the linger ends
        self._timer: threading.Timer | None = None

    @property
    def url(self) -> str:
        """The metrics URL."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{_PATH}"

    @property
    def closed(self) -> bool:
        """Whether the endpoint has stopped serving."""
        return self._closed

    def start_linger(self, seconds: float) -> None:
        """Keep serving for `seconds` from now, then close (even if `linger` is never called)."""
        with self._lock:
            if self._closed or self._until is not None:
                return
            self._until = time.monotonic() + seconds
            self._timer = threading.Timer(seconds, self.close)
            self._timer.daemon = True
            self._timer.start()

    def remaining_s(self) -> float:
        """Seconds left in the linger window (0 when closed or not lingering)."""
        if self._closed or self._until is None:
            return 0.0
        return max(0.0, self._until - time.monotonic())

    async def linger(self) -> None:
        """Wait out the linger window, then close; SIGINT or SIGTERM end it early.

        Cancellation: returns (raising `trio.Cancelled`) at once; the endpoint is closed
        either way.
        """
        try:
            remaining = self.remaining_s()
            if remaining > 0:
                await _wait_or_signal(remaining)
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self.close)

    def close(self) -> None:
        """Stop serving and close the socket (idempotent; blocking: a worker thread's)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            timer = self._timer
        if timer is not None and timer is not threading.current_thread():
            timer.cancel()
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    """A thread per request (a slow scraper never holds up another)."""

    daemon_threads = True


async def _wait_or_signal(seconds: float) -> None:
    """Sleep `seconds` (Trio's clock); return early on SIGINT or SIGTERM (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        await trio.sleep(seconds)  # signals can only be received on the main thread
        return
    with (
        trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals,
        trio.move_on_after(seconds),
    ):
        async for _ in signals:
            return
