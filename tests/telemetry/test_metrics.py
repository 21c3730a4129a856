"""The run's instruments: bounded labels, NeMo Gym's export names, breaker state, retries."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from builders import failed, landed, omitted
from trollout.collector.dispatch.retry import BreakerState, RetryState
from trollout.health import CHECKS
from trollout.telemetry.metrics import RunMetrics, metric_failure_class


def points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], Any]]]:
    """Collect now: each metric's data points as (attributes, value or histogram count)."""
    out: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                out[metric.name] = [
                    (
                        dict(p.attributes or {}),
                        getattr(p, "value", None) or getattr(p, "count", None),
                    )
                    for p in metric.data.data_points
                ]
    return out


@pytest.mark.parametrize(
    ("label", "shown"),
    [
        ("agent_run_error", "agent_run_error"),
        ("transient", "transient"),
        ("vendor.sandbox_oom", "vendor.sandbox_oom"),
        ("Some free text from a server: 42", "other"),
        ("x" * 500, "other"),
        ("", "other"),
    ],
)
def test_metric_failure_class_is_a_bounded_label(label: str, shown: str) -> None:
    """Known classes and namespaced names pass; anything else a producer sent is `other`."""
    assert metric_failure_class(label) == shown


def test_metrics_count_outcomes_retries_and_nemo_gym_exports() -> None:
    """Final outcomes by class, superseded attempts, omissions, retries and the export names."""
    reader = InMemoryMetricReader()
    metrics = RunMetrics(MeterProvider(metric_readers=[reader]), max_attempts=2)
    metrics.settled(landed(0, elapsed_seconds=1.5), True)
    metrics.settled(failed(1, 0, 0, failure_class="weird label", elapsed_seconds=0.2), False)
    metrics.settled(failed(1, 0, 1, failure_class="weird label", elapsed_seconds=0.3), True)
    metrics.settled(failed(2, failure_class="kill_shaped", no_persist=True), True)
    metrics.settled(omitted(3), True)
    metrics.settled(omitted(4, drained=True), True)
    metrics.retry("http_429", 0.5)
    got = points(reader)
    rollouts = {tuple(sorted(a.items())): v for a, v in got["trollout.rollouts"]}
    assert rollouts == {
        (("outcome", "landed"),): 1,
        (("failure_class", "other"), ("outcome", "failed")): 1,
        (("failure_class", "kill_shaped"), ("outcome", "no_persist")): 1,
        (("outcome", "omitted"),): 1,
        (("outcome", "drained"),): 1,
    }
    exports = {a["name"]: v for a, v in got["trollout.nemo_gym.export"]}
    assert exports == {
        "coverage/failed/other": 1,
        "retries/at_cap": 1,  # attempt 1 of a cap of 2
        "retries/attempts": 2,
        "retries/max_attempts": 2,
        "retries/rollouts_retried": 1,
    }
    durations = {a["outcome"]: n for a, n in got["trollout.attempt.duration"]}
    assert durations == {"landed": 1, "failed": 2}
    assert got["trollout.retries"] == [({"reason": "http_429"}, 1)]
    assert got["trollout.retry.wait"] == [({"reason": "http_429"}, 1)]
    assert got["trollout.reward"] == [({}, 1)]


def test_metrics_read_the_collector_when_collected() -> None:
    """In flight, queued, expected and each endpoint's breaker state, read at collection."""
    reader = InMemoryMetricReader()
    metrics = RunMetrics(MeterProvider(metric_readers=[reader]), max_attempts=3)
    state = RetryState()
    state.endpoint("http://127.0.0.1:1/run")
    state.endpoint("http://127.0.0.1:2/run")._enter(BreakerState.OPEN)
    metrics.collector = SimpleNamespace(in_flight=3, resident=5, retry_state=state)  # type: ignore[assignment]
    metrics.expected = 10
    got = points(reader)
    assert got["trollout.in_flight"] == [({}, 3)]
    assert got["trollout.queued"] == [({}, 2)]
    assert got["trollout.rollouts.expected"] == [({}, 10)]
    open_now = {
        a["endpoint"] for a, v in got["trollout.breaker.state"] if a["state"] == "open" and v
    }
    assert open_now == {"http://127.0.0.1:2"}
    transitions = {a["state"]: v for a, v in got["trollout.breaker.transitions"]}
    assert transitions["open"] == 1


def test_health_counts_verdicts_and_flagged_checks_with_bounded_labels() -> None:
    """The health step's verdicts and per-check findings; an id not among the 14 is `other`."""
    reader = InMemoryMetricReader()
    metrics = RunMetrics(MeterProvider(metric_readers=[reader]), max_attempts=1)
    assert "trollout.health.verdicts" not in points(reader)  # no points before the step ran
    issues = dict.fromkeys(CHECKS, 0)
    issues |= {"model_call_failed": 3, "task_consistently_unhealthy": 1, "made_up check": 2}
    metrics.health_checked({"healthy": 5, "unhealthy": 3, "unobserved": 0}, issues)
    got = points(reader)
    verdicts = {a["verdict"]: v or 0 for a, v in got["trollout.health.verdicts"]}
    assert verdicts == {"healthy": 5, "unhealthy": 3, "unobserved": 0}
    flagged = {a["check"]: v or 0 for a, v in got["trollout.health.flagged"]}
    assert set(flagged) == {*CHECKS, "other"}
    assert {c: n for c, n in flagged.items() if n} == {
        "model_call_failed": 3,
        "task_consistently_unhealthy": 1,
        "other": 2,
    }
