"""The run's telemetry: providers, exporters, the Prometheus endpoint, the engine's observer.

`open_telemetry` builds what `TelemetrySettings` asks for and yields a `Telemetry`, which is the
collector's `Observer` (collector/engine/observer.py). Telemetry never fails a rollout: every hook
catches its own errors (the first is logged, the rest are not), and exporting happens in the
SDK's threads. Closing ends the job span, freezes the Prometheus values (`prometheus`'s design
note), pushes them to a Pushgateway when one is configured, and flushes, bounded by
`SHUTDOWN_S`: an unreachable OTLP receiver or Pushgateway delays the end of a run by at most
that, and never changes an outcome. The OTLP exporters read each receiver reply up to
`otlp_session.MAX_TELEMETRY_REPLY_BYTES`.

Where the Prometheus endpoint's linger goes. Closing leaves the endpoint serving the final
values (when the run ended without an exception and ``metrics_linger_s`` > 0); the run layer
must then call `Telemetry.linger` as the very last step of the run: after aggregation, the
health check and the printed summary, before the process exits. It returns when the window
ends, on Ctrl-C / SIGTERM, or on cancellation, and always closes the endpoint. Not calling it
loses nothing but the window (the process exits, or the endpoint closes itself when the window
ends). Rejected: lingering inside ``open_telemetry``'s exit, which would hold up aggregation
and the summary by the whole window.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import IO, Final

import trio
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    InMemoryMetricReader,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from ..collector.engine.collector import Collector
from ..collector.engine.observer import AttemptTrace
from ..health import HealthReport
from ..records import Failed, Landed, MaterializedRow, Outcome
from . import TelemetrySettings
from .metrics import RunMetrics
from .otlp_session import METRICS_CREDENTIAL_VAR, TRACES_CREDENTIAL_VAR, otlp_session
from .prometheus import Exposition, MetricsServer
from .traces import AttemptSpan, Tracing

__all__ = ["SHUTDOWN_S", "Telemetry", "open_telemetry"]

SHUTDOWN_S: Final = 5.0  # the longest a run's end waits for telemetry to flush
_log = logging.getLogger("trollout.telemetry")


class _NoTrace:
    """An attempt's trace when traces are off: no headers."""

    __slots__ = ()
    headers = b""


_NO_TRACE: Final = _NoTrace()


class _Once(logging.Filter):
    """Lets the first warning or error through, then drops the rest (one notice per run)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        if self.seen:
            return False
        self.seen = True
        record.msg = f"trollout: telemetry: {record.msg} (further telemetry errors not shown)"
        return True


class Telemetry:
    """The run's traces and metrics; the collector's observer (`open_telemetry` makes one).

    Attributes:
        tracing: the tracer (None: traces off).
        metrics: the instruments (None: metrics off).
        exposition: the metrics as Prometheus sees them (None: neither served nor pushed).
        server: the Prometheus endpoint (None: not served).
        stream: where lines for people go (stderr when None).
    """

    def __init__(
        self,
        tracing: Tracing | None,
        metrics: RunMetrics | None,
        exposition: Exposition | None,
        server: MetricsServer | None,
        once: _Once,
        stream: IO[str] | None = None,
    ) -> None:
        self.tracing = tracing
        self.metrics = metrics
        self.exposition = exposition
        self.server = server
        self.stream = stream
        self._once = once
        self.collector: Collector | None = None

    def watch(
        self,
        collector: Collector,
        *,
        expected: int,
        attributes: Mapping[str, str | int] | None = None,
    ) -> None:
        """Start watching `collector`: its gauges, and the job span (with `attributes`).

        The run id (``trollout.run.id`` in `attributes`) labels ``trollout_run_info`` and
        groups the Pushgateway's copy.
        """
        self.collector = collector
        run_id = (attributes or {}).get("trollout.run.id")
        if self.exposition is not None and run_id is not None:
            self.exposition.run_id = str(run_id)
        if self.metrics is not None:
            self.metrics.collector = collector
            self.metrics.expected = expected
        if self.tracing is not None:
            self.tracing.start_job({"trollout.rollouts.expected": expected, **(attributes or {})})

    # --- the Observer hooks (collector/engine/observer.py) ---------------------------------------

    def attempt_started(self, row: MaterializedRow, attempt: int, url: str) -> AttemptTrace:
        """Open the attempt's span (its context goes out as ``traceparent``)."""
        if self.tracing is None:
            return _NO_TRACE
        try:
            return self.tracing.start_attempt(row, attempt, url)
        except Exception as exc:  # telemetry never fails a rollout
            self._error(exc)
            return _NO_TRACE

    def retry_wait(self, trace: AttemptTrace, reason: str, delay_s: float) -> None:
        """Count a re-send and its wait; note it on the attempt's span."""
        try:
            if self.metrics is not None:
                self.metrics.retry(reason, delay_s)
            if self.tracing is not None and type(trace) is AttemptSpan:
                self.tracing.retry_wait(trace, reason, delay_s)
        except Exception as exc:
            self._error(exc)

    def attempt_ended(
        self, trace: AttemptTrace, outcome: Landed | Failed | None, retries: int
    ) -> None:
        """Close the attempt's span with its outcome."""
        if self.tracing is None or type(trace) is not AttemptSpan:
            return
        try:
            self.tracing.end_attempt(trace, outcome, retries)
        except Exception as exc:
            self._error(exc)

    def outcome_settled(self, outcome: Outcome, final: bool) -> None:
        """Count a settled outcome."""
        if self.metrics is None:
            return
        try:
            self.metrics.settled(outcome, final)
        except Exception as exc:
            self._error(exc)

    def health_checked(self, report: HealthReport) -> None:
        """Count the run's health check (`RunMetrics.health_checked`); never raises."""
        if self.metrics is None:
            return
        try:
            self.metrics.health_checked(report.verdicts, report.issues)
        except Exception as exc:
            self._error(exc)

    def _error(self, exc: Exception) -> None:
        _log.warning("a telemetry hook failed: %r", exc)

    # --- the end ------------------------------------------------------------------------

    async def linger(self) -> None:
        """Serve the run's final values until the linger window ends, then close the endpoint.

        Call it last, after the summary is printed (module docstring). Returns at once when no
        endpoint lingers; early on SIGINT or SIGTERM (on the main thread).

        Cancellation: returns (raising `trio.Cancelled`) at once; the endpoint is closed.
        """
        server = self.server
        if server is None:
            return
        remaining = server.remaining_s()
        if remaining > 0:
            print(
                f"trollout: serving the final metrics at {server.url} for {remaining:.0f} s "
                "more (metrics_linger_s; Ctrl-C stops now)",
                file=self.stream or sys.stderr,
                flush=True,
            )
        await server.linger()

    def end_job(self) -> None:
        """Close the job span with the run's counts (idempotent)."""
        if self.tracing is None or self.collector is None:
            return
        progress = self.collector.progress
        self.tracing.end_job(
            {
                "trollout.rollouts.landed": progress.landed,
                "trollout.rollouts.failed": sum(progress.failed.values()),
                "trollout.rollouts.omitted": progress.omitted + progress.drained,
            }
        )


@asynccontextmanager
async def open_telemetry(
    settings: TelemetrySettings,
    *,
    max_attempts: int,
    stream: IO[str] | None = None,
    span_exporter: SpanExporter | None = None,
    metric_readers: Sequence[MetricReader] = (),
) -> AsyncIterator[Telemetry]:
    """Build the run's telemetry; yield it as the collector's observer; flush it on exit.

    Args:
        settings: what to export, and where (`telemetry_settings`).
        max_attempts: the run's attempt cap (NeMo Gym's retry export names use it).
        stream: where the Prometheus endpoint's URL is announced (stderr when None).
        span_exporter: spans go here instead of the configured exporter (tests, benchmarks).
        metric_readers: further metric readers (tests, benchmarks).

    Raises:
        ConfigError: the Prometheus endpoint's address cannot be bound.

    Cancellation: not a checkpoint on entry; on exit the flush runs shielded, at most
    `SHUTDOWN_S` seconds, so a cancelled run still exports what it can.
    """
    once = _install_log_filter()
    resource = Resource.create({"service.name": "trollout"})
    meter_provider, exposition, server = _meter_provider(settings, resource, metric_readers)
    tracer_provider = _tracer_provider(settings, resource, span_exporter)
    tracing = Tracing(tracer_provider) if tracer_provider is not None else None
    metrics = (
        RunMetrics(meter_provider, max_attempts=max_attempts)
        if meter_provider is not None
        else None
    )
    telemetry = Telemetry(tracing, metrics, exposition, server, once, stream)
    if server is not None:
        print(
            f"trollout: Prometheus metrics at {server.url}", file=stream or sys.stderr, flush=True
        )
    ended = False  # without an exception: the endpoint lingers
    try:
        yield telemetry
        ended = True
    finally:
        telemetry.end_job()
        if exposition is not None:
            _freeze(exposition)  # before the SDK shuts down: the last collection
        lingering = ended and server is not None and settings.linger_s > 0
        if lingering and server is not None:
            server.start_linger(settings.linger_s)  # `Telemetry.linger` waits it out
        push = settings.pushgateway if telemetry.collector is not None else None
        with trio.CancelScope(shield=True), trio.move_on_after(SHUTDOWN_S):
            await trio.to_thread.run_sync(
                _shutdown,
                tracer_provider,
                meter_provider,
                None if lingering else server,
                (exposition, push),
                abandon_on_cancel=True,
            )


def _tracer_provider(
    settings: TelemetrySettings, resource: Resource, exporter: SpanExporter | None
) -> TracerProvider | None:
    if exporter is None:
        if settings.traces == "otlp":
            endpoint = settings.otlp_endpoint
            exporter = OTLPSpanExporter(
                endpoint=f"{endpoint}/v1/traces" if endpoint else None,
                session=otlp_session(TRACES_CREDENTIAL_VAR),
            )
        elif settings.traces == "console":
            exporter = ConsoleSpanExporter()
        else:
            return None
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _meter_provider(
    settings: TelemetrySettings, resource: Resource, extra: Sequence[MetricReader]
) -> tuple[MeterProvider | None, Exposition | None, MetricsServer | None]:
    readers = list(extra)
    if settings.metrics == "otlp":
        endpoint = settings.otlp_endpoint
        exporter = OTLPMetricExporter(
            endpoint=f"{endpoint}/v1/metrics" if endpoint else None,
            session=otlp_session(METRICS_CREDENTIAL_VAR),
        )
        readers.append(PeriodicExportingMetricReader(exporter))
    elif settings.metrics == "console":
        readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter()))
    exposition = server = None
    if settings.prometheus is not None or settings.pushgateway is not None:
        reader = InMemoryMetricReader()
        exposition = Exposition(reader)
        if settings.prometheus is not None:
            server = MetricsServer(exposition.served, *settings.prometheus)
        readers.append(reader)
    if not readers:
        return None, None, None
    provider = MeterProvider(resource=resource, metric_readers=readers, shutdown_on_exit=False)
    return provider, exposition, server


def _freeze(exposition: Exposition) -> None:
    try:
        exposition.freeze()
    except Exception as exc:  # a failed collection loses the final values, never the run
        _log.warning("the final metrics could not be collected: %r", exc)


def _shutdown(
    tracer: TracerProvider | None,
    meter: MeterProvider | None,
    server: MetricsServer | None,
    push: tuple[Exposition | None, str | None],
) -> None:
    """Push, flush and stop everything (blocking; runs in a worker thread)."""
    exposition, gateway = push
    if exposition is not None and gateway is not None:
        try:
            exposition.push(gateway, timeout_s=SHUTDOWN_S)
        except Exception as exc:  # an unreachable gateway loses the push, never the run
            _log.warning("the push to the Pushgateway at %s failed: %r", gateway, exc)
    if server is not None:
        server.close()
    for provider in (tracer, meter):
        if provider is not None:
            try:
                provider.shutdown()
            except Exception as exc:  # a failed flush loses telemetry, never the run
                _log.warning("telemetry shutdown failed: %r", exc)


def _install_log_filter() -> _Once:
    """Show the first OpenTelemetry export error of the run, not one per failed batch."""
    once = _Once()
    names = [name for name in logging.root.manager.loggerDict if name.startswith("opentelemetry")]
    for name in [*names, "opentelemetry", "trollout.telemetry"]:
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, _Once)]:
            logger.removeFilter(old)
        logger.addFilter(once)
    return once
