"""The Prometheus endpoint: the run's OpenTelemetry metrics, served by prometheus-client.

Design note. The metrics are kept once, by the OpenTelemetry SDK; this module is a
prometheus-client `Collector` that reads them from an `InMemoryMetricReader` (cumulative) at
each scrape and renders them as Prometheus families: a monotonic sum as a counter (``_total``),
any other sum or gauge as a gauge, a histogram as a histogram (``_bucket``, ``_sum``,
``_count``). Names are the instrument's with dots as underscores and a ``_seconds`` suffix for
``s`` units (``trollout.attempt.duration`` -> ``trollout_attempt_duration_seconds``). The
server is prometheus-client's WSGI server in a daemon thread, bound to 127.0.0.1 unless told
otherwise; a scrape never touches the event loop.

Rejected alternative: a second set of prometheus-client instruments fed beside the OTel ones.
Every event would be counted twice, and the two views could disagree.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any

from opentelemetry.sdk.metrics.export import (
    Gauge,
    Histogram,
    InMemoryMetricReader,
    Metric,
    Sum,
)
from prometheus_client import start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.core import (
    Metric as PromMetric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from ..errors import ConfigError

__all__ = ["MetricsServer", "prometheus_name"]

_INVALID = re.compile(r"[^a-zA-Z0-9_:]")


def prometheus_name(name: str, unit: str | None) -> str:
    """Return an instrument's Prometheus name (dots to underscores, seconds suffixed)."""
    base = _INVALID.sub("_", name)
    return base + "_seconds" if unit == "s" else base


class _Bridge(Collector):
    """Renders the reader's metrics as Prometheus families at each scrape."""

    def __init__(self, reader: InMemoryMetricReader) -> None:
        self.reader = reader

    def collect(self) -> Iterator[PromMetric]:
        data = self.reader.get_metrics_data()
        for resource_metrics in data.resource_metrics if data is not None else ():
            for scope in resource_metrics.scope_metrics:
                for metric in scope.metrics:
                    family = _family(metric)
                    if family is not None:
                        yield family


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


class MetricsServer:
    """A Prometheus endpoint serving `reader`'s metrics at ``http://host:port/metrics``.

    Raises:
        ConfigError: the address cannot be bound (in use, or not an address of this host).
    """

    def __init__(self, reader: InMemoryMetricReader, host: str, port: int) -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Bridge(reader))
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            raise ConfigError(
                f"the Prometheus endpoint cannot listen on {host}:{port} ({exc.strerror or exc}); "
                "pass another --metrics-port (0 picks a free one) or --metrics-host"
            ) from exc
        self.host = host
        self.port: int = self._server.server_port

    @property
    def url(self) -> str:
        """The metrics URL."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and close the socket (blocking: call it from a worker thread)."""
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
