"""`trollout collect --otlp-endpoint`: spans and metrics reach a real OTLP/HTTP receiver.

The receiver (otlp_receiver.py) listens on 127.0.0.1 and decodes with opentelemetry-proto; the
run goes to a fake deployment in its own process, with a 500 and a producer's failure class
among its rows. With the receiver down the run ends the same way.
"""

from __future__ import annotations

import json
import logging
import socket
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from otlp_receiver import otlp_receiver

from builders import count_lines, invoke, read_jsonl, write_tasks_input
from trollout.health import CHECKS
from trollout.testing import FakeUrls

TASKS = 8
FAULTS: dict[int, dict[str, Any]] = {
    1: {"kind": "status", "status": 500, "body": "boom"},
    2: {"kind": "failure_class", "failure_class": "transient"},
}


def collect(tmp_path: Path, fake: FakeUrls, endpoint: str, name: str) -> Any:
    """Run `trollout collect` in process with traces and metrics going to `endpoint`."""
    source = tmp_path / "tasks.jsonl"
    if not source.exists():
        write_tasks_input(source, TASKS, faults=FAULTS)
    return invoke(
        "collect",
        str(source),
        "-o",
        str(tmp_path / name / "r.jsonl"),
        *("--head-server", fake.head_url, "--agent", "math_agent"),
        *("--progress", "plain", "--no-aggregate", "--otlp-endpoint", endpoint),
        env={"OTEL_EXPORTER_OTLP_TIMEOUT": "1", "OTEL_METRIC_EXPORT_INTERVAL": "600000"},
    )


def point_sums(metrics: list[Any], label: str) -> Counter[str]:
    """Sum the last export's data points of a counter by one attribute."""
    sums: Counter[str] = Counter()
    for point in metrics[-1].sum.data_points:
        attrs = {kv.key: kv.value.string_value for kv in point.attributes}
        sums[attrs.get(label, "")] += point.as_int
    return sums


def test_otlp_receiver_gets_the_runs_spans_and_metrics(tmp_path: Path, fake: FakeUrls) -> None:
    """One job span, one dispatch span per attempt, and outcome counts matching the folder."""
    with otlp_receiver() as (url, received):
        result = collect(tmp_path, fake, url, "up")
    assert result.exit_code == 0, (result.output, result.exception)
    names = Counter(span.name for span in received.spans)
    assert names == {"job": 1, "dispatch": TASKS}
    [job] = [span for span in received.spans if span.name == "job"]
    for span in received.spans:
        if span.name == "dispatch":
            assert span.parent_span_id == b""  # a root
            assert [link.span_id for link in span.links] == [job.span_id]
    outcomes = point_sums(received.metrics["trollout.rollouts"], "outcome")
    assert outcomes["landed"] == count_lines(tmp_path / "up" / "r.jsonl") == TASKS - 2
    failures = read_jsonl(tmp_path / "up" / "r_failures.jsonl")
    assert outcomes["failed"] == len(failures) == 2
    classes = point_sums(received.metrics["trollout.rollouts"], "failure_class")
    assert classes["transient"] == 1
    assert "trollout.attempt.duration" in received.metrics
    assert "trollout.nemo_gym.export" in received.metrics


def test_otlp_receiver_down_changes_no_outcome(
    tmp_path: Path, fake: FakeUrls, caplog: pytest.LogCaptureFixture
) -> None:
    """An unreachable receiver: exit 0, the same rows, and one telemetry error shown at most."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with caplog.at_level(logging.WARNING):
        down = collect(tmp_path, fake, closed, "down")
    assert down.exit_code == 0, (down.output, down.exception)
    shown = [r for r in caplog.records if r.name.startswith(("opentelemetry", "trollout.tele"))]
    assert len(shown) <= 1
    landed = sorted(row["_ng_task_index"] for row in read_jsonl(tmp_path / "down" / "r.jsonl"))
    assert landed == [t for t in range(TASKS) if t not in FAULTS]
    failed = read_jsonl(tmp_path / "down" / "r_failures.jsonl")
    assert sorted(row["_ng_task_index"] for row in failed) == sorted(FAULTS)


def test_the_last_export_counts_the_health_check(tmp_path: Path, fake: FakeUrls) -> None:
    """After the health step, the run's metrics hold its verdicts and findings per check,
    equal to quality_summary.json, labelled only by the 14 check ids."""
    source = tmp_path / "tasks.jsonl"
    write_tasks_input(source, TASKS, faults=FAULTS)
    with otlp_receiver() as (url, received):
        result = invoke(
            "collect",
            str(source),
            "-o",
            str(tmp_path / "run" / "r.jsonl"),
            *("--head-server", fake.head_url, "--agent", "math_agent"),
            *("--progress", "plain", "--otlp-endpoint", url),
            env={"OTEL_EXPORTER_OTLP_TIMEOUT": "1", "OTEL_METRIC_EXPORT_INTERVAL": "600000"},
        )
    assert result.exit_code == 0, (result.output, result.exception)
    summary = json.loads((tmp_path / "run" / "quality_summary.json").read_text())["run"]
    verdicts = point_sums(received.metrics["trollout.health.verdicts"], "verdict")
    assert dict(verdicts) == summary["verdicts"]
    assert sum(verdicts.values()) == TASKS - 2  # the landed rows
    flagged = point_sums(received.metrics["trollout.health.flagged"], "check")
    assert set(flagged) == set(CHECKS)
    assert dict(flagged) == summary["issues"]
