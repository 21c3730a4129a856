"""The Prometheus endpoint, scraped while a run is in flight, agrees with the run folder.

The run (`collect_run`, in process) goes over loopback to the fake deployment; its last
rollouts hang until the test has scraped, so the scrape sees a known state: every other
rollout settled, the hanging ones in flight. Synchronised on the collector's counters, never
on time. The scrape is parsed with prometheus-client's own parser.
"""

from __future__ import annotations

import io
import re
import socket
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from builders import collect_config, count_lines, read_jsonl, wait_until, write_tasks_input
from trollout.cli.collect import collect_run
from trollout.collector.engine.collector import Collector
from trollout.recovery.manifest import read_manifest
from trollout.testing import AgentSpec, DeploymentSpec, Fault, FaultContext, open_fake_deployment

TASKS, HANGING = 12, 3
SPEC = DeploymentSpec(agents=(AgentSpec(name="math_agent"),))


def faults(context: FaultContext) -> Fault | None:
    """Task 1: a 500; task 2: a producer's class; the last HANGING tasks never answer."""
    if context.task_index == 1:
        return Fault(kind="status", status=500, body="boom")
    if context.task_index == 2:
        return Fault(kind="failure_class", failure_class="transient")
    if context.task_index >= TASKS - HANGING:
        return Fault(kind="hang")
    return None


def samples(text: str) -> dict[str, list[Any]]:
    """Parse an exposition into samples by sample name."""
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def scrape(url: str) -> str:
    """GET the metrics page (blocking)."""
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


async def test_prometheus_mid_run_scrape_agrees_with_the_folder(tmp_path: Path) -> None:
    """In flight, outcomes by class and latency buckets, scraped mid-run, match the files; the
    run's id and the process metrics are there; any path but /metrics is 404."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", TASKS)
    stream = io.StringIO()
    scraped: list[str] = []

    async def scrape_then_stop(collector: Collector) -> str:
        await wait_until(
            lambda: (
                collector.progress.settled == TASKS - HANGING and collector.in_flight == HANGING
            ),
            "every other rollout settled and the hanging ones in flight",
        )
        match = re.search(r"Prometheus metrics at (\S+)", stream.getvalue())
        assert match is not None, stream.getvalue()
        assert match[1].startswith("http://127.0.0.1:")  # loopback unless told otherwise
        scraped.append(await trio.to_thread.run_sync(scrape, match[1]))
        elsewhere = match[1].removesuffix("/metrics") + "/"
        with pytest.raises(urllib.error.HTTPError) as info:
            await trio.to_thread.run_sync(scrape, elsewhere)
        info.value.close()
        assert info.value.code == 404  # /metrics only
        return "the test has scraped"

    async with open_fake_deployment(SPEC, fault_fn=faults) as fake:
        config = collect_config(
            source,
            tmp_path / "run" / "r.jsonl",
            fake.head_url,
            metrics_port=0,
            num_samples_in_parallel=8,
            grace_s=0.0,
            disable_aggregation=True,
        )
        result = await collect_run(
            config, progress_stream=stream, live=False, stop_when=scrape_then_stop
        )
    assert result.stopped == "the test has scraped"
    got = samples(scraped[0])

    assert [s.value for s in got["trollout_in_flight"]] == [HANGING]
    manifest = read_manifest(result.layout)
    assert manifest is not None
    [info] = got["trollout_run_info"]  # the run's identity, and the process's metrics
    assert info.labels["run_id"] == manifest.run_id
    assert "process_cpu_seconds_total" in got
    assert [s.value for s in got["trollout_queued"]] == [0]
    assert [s.value for s in got["trollout_rollouts_expected"]] == [TASKS]
    by_outcome: Counter[tuple[str, str]] = Counter()
    for sample in got["trollout_rollouts_total"]:
        by_outcome[(sample.labels["outcome"], sample.labels["failure_class"])] += sample.value
    landed = count_lines(tmp_path / "run" / "r.jsonl")
    failures = Counter(
        row["_ng_failure_class"] for row in read_jsonl(tmp_path / "run" / "r_failures.jsonl")
    )
    assert landed == TASKS - HANGING - 2
    assert by_outcome == {("landed", ""): landed} | {("failed", c): n for c, n in failures.items()}
    assert sum(failures.values()) == 2
    assert failures["transient"] == 1

    counts = {s.labels["outcome"]: s.value for s in got["trollout_attempt_duration_seconds_count"]}
    assert counts == {"landed": landed, "failed": sum(failures.values())}
    for outcome, count in counts.items():
        buckets = [
            s
            for s in got["trollout_attempt_duration_seconds_bucket"]
            if s.labels["outcome"] == outcome
        ]
        values = [s.value for s in buckets]
        assert values == sorted(values)
        assert buckets[-1].labels["le"] == "+Inf"
        assert values[-1] == count
    exports = {s.labels["name"]: s.value for s in got["trollout_nemo_gym_export"]}
    assert exports["retries/attempts"] == sum(failures.values())
    assert exports["retries/max_attempts"] == config.max_attempts
    for name, n in failures.items():
        assert exports[f"coverage/failed/{name}"] == n


def test_prometheus_port_in_use_is_refused_before_writing(tmp_path: Path) -> None:
    """--metrics-port on a port already bound: exit 2 naming it, no run folder, nothing sent."""
    from builders import invoke

    source = write_tasks_input(tmp_path / "tasks.jsonl", 2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = invoke(
            "collect",
            str(source),
            "-o",
            str(tmp_path / "run" / "r.jsonl"),
            *("--agent-url", "math_agent=http://127.0.0.1:9", "--agent", "math_agent"),
            *("--metrics-port", str(port)),
        )
    assert result.exit_code == 2, result.output
    assert f"127.0.0.1:{port}" in result.output
    assert "--metrics-port" in result.output
    assert not (tmp_path / "run").exists()
