"""Off means off: with no telemetry configured, no OpenTelemetry or Prometheus module loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from builders import HANG_GUARD_S, count_lines, write_tasks_input
from trollout.errors import ConfigError
from trollout.settings import RunConfig
from trollout.telemetry import TelemetrySettings, telemetry_settings
from trollout.testing import FakeUrls

# Runs `trollout collect` in this interpreter, then prints which telemetry modules it loaded.
PROBE = """
import json, sys
from trollout.cli.main import cli
try:
    cli.main(sys.argv[1:], standalone_mode=False)
finally:
    loaded = [m for m in sys.modules if m.split(".")[0] in ("opentelemetry", "prometheus_client")]
    print("LOADED " + json.dumps(sorted(loaded)))
"""


def run_probe(tmp_path: Path, fake: FakeUrls, *extra: str) -> list[str]:
    """Collect 4 tasks in a fresh interpreter; return the telemetry modules it imported."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", 4)
    out = tmp_path / "run" / "r.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACE"))}
    args = [str(source), "-o", str(out), "--head-server", fake.head_url, "--agent", "math_agent"]
    command = [sys.executable, "-c", PROBE, "collect", *args, "--no-aggregate", *extra]
    proc = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=HANG_GUARD_S, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert count_lines(out) == 4
    [line] = [line for line in proc.stdout.splitlines() if line.startswith("LOADED ")]
    return list(json.loads(line.removeprefix("LOADED ")))


def test_off_means_off_collect_imports_no_telemetry_module(tmp_path: Path, fake: FakeUrls) -> None:
    """Nothing configured: a whole `trollout collect` loads no opentelemetry/prometheus module."""
    assert run_probe(tmp_path, fake) == []


def test_off_means_off_probe_sees_telemetry_when_asked(tmp_path: Path, fake: FakeUrls) -> None:
    """The guard on the guard: with --metrics-port the same probe does see them load (no
    linger after the run: the endpoint's 60 s default would only make the test wait)."""
    loaded = run_probe(tmp_path, fake, "--metrics-port", "0", "--metrics-linger", "0")
    assert "opentelemetry.sdk.metrics" in loaded
    assert "prometheus_client" in loaded


def test_off_means_off_import_trollout_loads_nothing() -> None:
    """`import trollout` (the public API) loads no telemetry module."""
    code = (
        "import sys, trollout, trollout.cli.main, trollout.telemetry; "
        "print([m for m in sys.modules if m.startswith(('opentelemetry', 'prometheus_client'))])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=True,
    )
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("env", "config", "expected"),
    [
        ({}, RunConfig(), None),
        ({"OTEL_TRACES_EXPORTER": "none"}, RunConfig(), None),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"},
            RunConfig(),
            TelemetrySettings(traces="otlp", metrics="otlp"),
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_METRICS_EXPORTER": "none"},
            RunConfig(),
            TelemetrySettings(traces="otlp"),
        ),
        (
            {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
            RunConfig(),
            None,
        ),
        (
            {"OTEL_SDK_DISABLED": "true"},
            RunConfig(metrics_port=9100),
            TelemetrySettings(prometheus=("127.0.0.1", 9100)),
        ),
        (
            {},
            RunConfig(otlp_endpoint="http://c:4318/"),
            TelemetrySettings(traces="otlp", metrics="otlp", otlp_endpoint="http://c:4318"),
        ),
        (
            {"OTEL_METRICS_EXPORTER": "prometheus"},
            RunConfig(),
            TelemetrySettings(prometheus=("127.0.0.1", 9464)),
        ),
        (
            {},
            RunConfig(metrics_port=0, metrics_linger_s=15),
            TelemetrySettings(prometheus=("127.0.0.1", 0), linger_s=15),
        ),
        (
            {},
            RunConfig(metrics_pushgateway="http://gw:9091/"),
            TelemetrySettings(pushgateway="http://gw:9091"),
        ),
    ],
)
def test_telemetry_settings_follow_the_otel_variables(
    env: dict[str, str], config: RunConfig, expected: TelemetrySettings | None
) -> None:
    """The standard OTEL_* variables and the options decide what is on; nothing set: off."""
    assert telemetry_settings(config, env) == expected


def test_telemetry_settings_without_prometheus_ignore_every_way_to_ask() -> None:
    """prometheus=False (a Ray block): neither --metrics-port nor OTEL_METRICS_EXPORTER=
    prometheus serves an endpoint, nothing is pushed; traces over OTLP still go out."""
    env = {"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_PORT": "9100"}
    config = RunConfig(metrics_port=9101, metrics_pushgateway="http://gw:9091")
    assert telemetry_settings(config, env, prometheus=False) is None
    traced = {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}
    assert telemetry_settings(config, traced, prometheus=False) == TelemetrySettings(traces="otlp")


@pytest.mark.parametrize(
    ("env", "config", "named"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, RunConfig(), "OTEL_TRACES_EXPORTER"),
        ({"OTEL_METRICS_EXPORTER": "statsd"}, RunConfig(), "OTEL_METRICS_EXPORTER"),
        ({}, RunConfig(otlp_endpoint="collector:4318"), "otlp_endpoint"),
        ({}, RunConfig(metrics_pushgateway="gw:9091"), "metrics_pushgateway .* 'gw:9091'"),
        (
            {},
            RunConfig(metrics_pushgateway="http://alice:hunter2@gw:9091"),
            "^metrics_pushgateway .*credentials.*not supported",
        ),
        (
            {"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_PORT": "x"},
            RunConfig(),
            "OTEL_EXPORTER_PROMETHEUS_PORT",
        ),
    ],
)
def test_telemetry_settings_refuse_bad_values(
    env: dict[str, str], config: RunConfig, named: str
) -> None:
    """A bad exporter, endpoint or port: a ConfigError naming it and the value (never a
    password)."""
    with pytest.raises(ConfigError, match=named) as info:
        telemetry_settings(config, env)
    assert "hunter2" not in str(info.value)


def test_collect_refuses_a_bad_otel_variable_before_writing(tmp_path: Path) -> None:
    """OTEL_TRACES_EXPORTER=zipkin: exit 2, one line naming it, no run folder written."""
    from builders import invoke

    source = write_tasks_input(tmp_path / "tasks.jsonl", 2)
    out = tmp_path / "run" / "r.jsonl"
    result = invoke(
        "collect",
        str(source),
        "-o",
        str(out),
        "--agent-url",
        "math_agent=http://127.0.0.1:9",
        env={"OTEL_TRACES_EXPORTER": "zipkin"},
    )
    assert result.exit_code == 2, result.output
    assert "OTEL_TRACES_EXPORTER" in result.output
    assert "'zipkin'" in result.output
    assert not (tmp_path / "run").exists()


def test_collect_without_the_extra_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Telemetry asked for but not installed: exit 2 naming the extra, nothing written."""
    from builders import invoke

    monkeypatch.setitem(sys.modules, "trollout.telemetry.runtime", None)  # import fails
    source = write_tasks_input(tmp_path / "tasks.jsonl", 2)
    result = invoke(
        "collect",
        str(source),
        "-o",
        str(tmp_path / "run" / "r.jsonl"),
        *("--agent-url", "math_agent=http://127.0.0.1:9", "--agent", "math_agent"),
        *("--metrics-port", "0"),
    )
    assert result.exit_code == 2, result.output
    assert "trollout[telemetry]" in result.output
    assert not (tmp_path / "run").exists()


def test_resume_takes_the_telemetry_options() -> None:
    """resume and resubmit can be watched like collect: the same three options."""
    from builders import invoke

    for command in ("resume", "resubmit"):
        shown = invoke(command, "--help").output
        assert all(o in shown for o in ("--otlp-endpoint", "--metrics-port", "--metrics-host"))


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"OTEL_METRIC_EXPORT_INTERVAL": "-5"}, "OTEL_METRIC_EXPORT_INTERVAL"),
        ({"OTEL_METRIC_EXPORT_INTERVAL": "0"}, "OTEL_METRIC_EXPORT_INTERVAL"),
        ({"OTEL_METRIC_EXPORT_TIMEOUT": "soon"}, "OTEL_METRIC_EXPORT_TIMEOUT"),
        ({"OTEL_BSP_MAX_QUEUE_SIZE": "many"}, "OTEL_BSP_MAX_QUEUE_SIZE"),
        ({"OTEL_BSP_SCHEDULE_DELAY": "1.5"}, "OTEL_BSP_SCHEDULE_DELAY"),
        ({"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "4096"}, "must not exceed OTEL_BSP_MAX_QUEUE_SIZE"),
    ],
)
def test_telemetry_settings_refuse_numbers_the_exporters_reject(
    env: dict[str, str], named: str
) -> None:
    """A number OpenTelemetry would reject (a ValueError) or log a traceback for: refused,
    naming the variable; the same variables are ignored for a signal that is off."""
    asked = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", **env}
    with pytest.raises(ConfigError, match=named):
        telemetry_settings(RunConfig(), asked)
    off = {**asked, "OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}
    assert telemetry_settings(RunConfig(), off) is None
    fine = {**asked, **dict.fromkeys(env, "250")}
    assert telemetry_settings(RunConfig(), fine) is not None


def test_collect_refuses_a_negative_metric_export_interval_in_one_line(tmp_path: Path) -> None:
    """OTEL_METRIC_EXPORT_INTERVAL=-5 (a traceback from the SDK before): exit 2, one line
    naming the variable and the value, no run folder written."""
    from builders import invoke

    source = write_tasks_input(tmp_path / "tasks.jsonl", 2)
    out = tmp_path / "run" / "r.jsonl"
    result = invoke(
        "collect",
        str(source),
        "-o",
        str(out),
        *("--agent-url", "math_agent=http://127.0.0.1:9", "--agent", "math_agent"),
        env={
            "OTEL_METRIC_EXPORT_INTERVAL": "-5",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
        },
    )
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert "OTEL_METRIC_EXPORT_INTERVAL" in lines[0]
    assert "'-5'" in lines[0]
    assert not (tmp_path / "run").exists()
