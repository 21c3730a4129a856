"""Watching a run while it runs: OpenTelemetry traces and metrics, a Prometheus endpoint.

This module decides, from a `RunConfig` and the standard ``OTEL_*`` environment variables,
whether telemetry is on and where it goes (`telemetry_settings`); it imports nothing beyond the
standard library, so a run with telemetry off never loads OpenTelemetry or prometheus-client
("off means off"). `runtime.open_telemetry` (imported only when the settings say so) builds
the providers and the engine's observer; `traces`, `metrics` and `prometheus` hold the parts.

What turns telemetry on:

- traces and metrics over OTLP/HTTP: ``--otlp-endpoint URL`` (``+otlp_endpoint``), or
  ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT``, or
  ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` set to ``otlp`` or ``console``;
  ``none`` turns one signal off, and ``OTEL_SDK_DISABLED=true`` turns both off;
- a Prometheus endpoint: ``--metrics-port PORT`` (bound to ``--metrics-host``, 127.0.0.1 by
  default), or ``OTEL_METRICS_EXPORTER=prometheus`` (``OTEL_EXPORTER_PROMETHEUS_HOST`` /
  ``_PORT``, default 127.0.0.1:9464). It is served even under ``OTEL_SDK_DISABLED``: it is
  trollout's own endpoint, asked for by name. It serves ``/metrics`` only, and the final values
  for ``metrics_linger_s`` (default 60) seconds after the run (`prometheus`'s design note);
- a push of the final values to a Pushgateway: ``metrics_pushgateway`` (an http:// or https://
  URL), with or without the endpoint.

Every other ``OTEL_*`` variable (headers, timeouts, compression, the sampler, resource
attributes, ``TRACEPARENT`` for the job span's parent) is read where OpenTelemetry reads it.

The numbers OpenTelemetry's exporters read when they are built (``OTEL_METRIC_EXPORT_INTERVAL``
and ``_TIMEOUT``, ``OTEL_BSP_*``) are checked here too, for the signals that are on: the SDK
raises a bare ``ValueError`` for some (an interval of -5) and logs a traceback and goes on with
its default for others (``OTEL_BSP_MAX_QUEUE_SIZE=many``), and both happen after the run has
begun. Each is refused up front, in one line naming the variable, the value and its range
(`_NUMBERS`). Rejected alternative: catching the SDK's ``ValueError`` where the providers are
built: its messages do not name the variable, and the logged tracebacks would still pass.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final
from urllib.parse import urlsplit

from attrs import frozen

from ..errors import ConfigError
from ..settings import DEFAULT_METRICS_LINGER_S, RunConfig

__all__ = ["TelemetrySettings", "telemetry_settings"]

_EXPORTERS: Final = frozenset({"otlp", "console", "none"})
_ENDPOINT_VARS: Final = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)
_PROMETHEUS_PORT: Final = 9464  # OpenTelemetry's default for OTEL_EXPORTER_PROMETHEUS_PORT
# The numbers the exporters read, by the signal that reads them: (name, integer only, minimum,
# what the number is). Every one must be > its minimum; OTEL_BSP_MAX_EXPORT_BATCH_SIZE must
# also not exceed OTEL_BSP_MAX_QUEUE_SIZE (default 2048), as the SDK requires.
_NUMBERS: Final = {
    "metrics": (
        ("OTEL_METRIC_EXPORT_INTERVAL", False, 0, "milliseconds between exports"),
        ("OTEL_METRIC_EXPORT_TIMEOUT", False, 0, "milliseconds an export may take"),
    ),
    "traces": (
        ("OTEL_BSP_SCHEDULE_DELAY", True, 0, "milliseconds between span exports"),
        ("OTEL_BSP_EXPORT_TIMEOUT", True, 0, "milliseconds a span export may take"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", True, 0, "spans queued for export"),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", True, 0, "spans per export"),
    ),
}
_BSP_QUEUE_DEFAULT: Final = 2048


@frozen
class TelemetrySettings:
    """Where a run's telemetry goes (see the module docstring for how it is chosen).

    Attributes:
        traces: the span exporter: ``"otlp"``, ``"console"`` or None (no traces).
        metrics: the OTel metric exporter: ``"otlp"``, ``"console"`` or None.
        otlp_endpoint: the OTLP/HTTP base URL given on the command line; None leaves it to
            the ``OTEL_EXPORTER_OTLP_*ENDPOINT`` variables (default ``http://localhost:4318``).
        prometheus: ``(host, port)`` of the Prometheus endpoint, or None.
        linger_s: how long the endpoint serves the final values after the run.
        pushgateway: the Pushgateway's base URL the final values are pushed to, or None.
    """

    traces: str | None = None
    metrics: str | None = None
    otlp_endpoint: str | None = None
    prometheus: tuple[str, int] | None = None
    linger_s: float = DEFAULT_METRICS_LINGER_S
    pushgateway: str | None = None

    @property
    def metrics_on(self) -> bool:
        """Whether any metrics are kept (an exporter, the endpoint, a Pushgateway)."""
        return self.metrics is not None or self.prometheus is not None or bool(self.pushgateway)


def telemetry_settings(
    config: RunConfig, environ: Mapping[str, str] | None = None, *, prometheus: bool = True
) -> TelemetrySettings | None:
    """Return where a run's telemetry goes, or None when nothing asks for any.

    Args:
        config: the run's settings (``otlp_endpoint``, ``metrics_port``, ``metrics_host``,
            ``metrics_linger_s``, ``metrics_pushgateway``).
        environ: the ``OTEL_*`` variables (the process environment when None).
        prometheus: False serves no Prometheus endpoint and pushes nothing, whatever the
            config and the environment ask: runs that share a host (Ray blocks) cannot share
            one port, and blocks of one run would replace each other's pushed group.

    Raises:
        ConfigError: an exporter variable, the OTLP endpoint, the Pushgateway URL or the
            Prometheus port is not valid (checked before anything is written or dispatched).
    """
    env = os.environ if environ is None else environ
    endpoint = _endpoint(config.otlp_endpoint)
    gateway = _endpoint(config.metrics_pushgateway, "metrics_pushgateway")
    asked = endpoint is not None or any(env.get(name) for name in _ENDPOINT_VARS)
    disabled = env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    traces = _exporter(env, "OTEL_TRACES_EXPORTER", asked)
    metrics = _exporter(env, "OTEL_METRICS_EXPORTER", asked, extra={"prometheus"})
    served = _prometheus(config, env, metrics == "prometheus")
    if disabled:
        traces = metrics = None
    _check_numbers(env, traces=traces is not None, metrics=metrics not in (None, "prometheus"))
    settings = TelemetrySettings(
        traces=traces,
        metrics=None if metrics == "prometheus" else metrics,
        otlp_endpoint=endpoint,
        prometheus=served if prometheus else None,
        linger_s=config.metrics_linger_s,
        pushgateway=gateway if prometheus else None,
    )
    return settings if settings.traces is not None or settings.metrics_on else None


def _exporter(
    env: Mapping[str, str],
    name: str,
    asked: bool,
    *,
    extra: frozenset[str] | set[str] = frozenset(),
) -> str | None:
    raw = env.get(name)
    value = (raw or ("otlp" if asked else "none")).strip().lower()
    known = _EXPORTERS | extra
    if value not in known:
        raise ConfigError(
            f"{name} must be one of {', '.join(sorted(known))} (got {raw!r}); trollout exports "
            "over OTLP/HTTP: set it to otlp, or unset it"
        )
    return None if value == "none" else value


_URL_KEYS: Final = {
    # key: (how it is given, an example, what to do instead of user:password@, otherwise)
    "otlp_endpoint": (
        "otlp_endpoint (--otlp-endpoint)",
        "http://127.0.0.1:4318",
        "put credentials in OTEL_EXPORTER_OTLP_HEADERS",
        "put credentials in OTEL_EXPORTER_OTLP_HEADERS",
    ),
    "metrics_pushgateway": (
        "metrics_pushgateway",
        "http://127.0.0.1:9091",
        "a Pushgateway behind authentication is not supported: reach it through a local proxy",
        "fix it, or unset it",
    ),
}


def _endpoint(url: str | None, key: str = "otlp_endpoint") -> str | None:
    """Check a telemetry receiver's base URL (http or https, a host, no user:password@)."""
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname or "@" in parts.netloc:
        given, example, credentials, otherwise = _URL_KEYS[key]
        shown = url if "@" not in url else "<a URL with credentials>"
        raise ConfigError(
            f"{given} must be an http:// or https:// base URL such as {example} "
            f"(got {shown!r}); {credentials if '@' in url else otherwise}"
        )
    return url.rstrip("/")


def _prometheus(
    config: RunConfig, env: Mapping[str, str], from_env: bool
) -> tuple[str, int] | None:
    if config.metrics_port is not None:
        return (config.metrics_host, config.metrics_port)
    if not from_env:
        return None
    raw = env.get("OTEL_EXPORTER_PROMETHEUS_PORT", str(_PROMETHEUS_PORT))
    if not raw.isdigit() or int(raw) > 65535:
        raise ConfigError(
            f"OTEL_EXPORTER_PROMETHEUS_PORT must be a port from 0 to 65535 (got {raw!r}); fix "
            "it, or pass --metrics-port"
        )
    return (env.get("OTEL_EXPORTER_PROMETHEUS_HOST", "127.0.0.1"), int(raw))


def _check_numbers(env: Mapping[str, str], *, traces: bool, metrics: bool) -> None:
    """Refuse an ``OTEL_*`` number the exporters of the signals that are on would reject."""
    found: dict[str, float] = {}
    for signal, on in (("metrics", metrics), ("traces", traces)):
        for name, integral, minimum, what in _NUMBERS[signal] if on else ():
            raw = env.get(name)
            if raw is None or not raw.strip():
                continue
            number = _number(raw, integral=integral)
            if number is None or not number > minimum:
                kind = "a whole number" if integral else "a number"
                raise ConfigError(
                    f"{name} must be {kind} > {minimum} ({what}; got {raw!r}); fix it, or "
                    "unset it for OpenTelemetry's default"
                )
            found[name] = number
    batch = found.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE")
    queue = found.get("OTEL_BSP_MAX_QUEUE_SIZE", _BSP_QUEUE_DEFAULT)
    if batch is not None and batch > queue:
        raise ConfigError(
            f"OTEL_BSP_MAX_EXPORT_BATCH_SIZE ({batch:.0f}) must not exceed "
            f"OTEL_BSP_MAX_QUEUE_SIZE ({queue:.0f}); lower the batch or raise the queue"
        )


def _number(raw: str, *, integral: bool) -> float | None:
    """Parse an ``OTEL_*`` number as the SDK does (``int`` or ``float``); None if it cannot."""
    try:
        return float(int(raw)) if integral else float(raw)
    except ValueError:
        return None
