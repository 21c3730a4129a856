"""End to end over loopback: `collect_run` against the fake deployment with scripted faults."""

from __future__ import annotations

import json
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import pytest

from builders import HangArrivals, cancel_when, collect_config, write_tasks_input
from builders import read_jsonl as read
from trollout import jsonl
from trollout.cli.collect import collect_run
from trollout.recovery.layout import RunLayout
from trollout.settings import RunConfig
from trollout.testing import (
    AgentSpec,
    DeploymentSpec,
    Fault,
    FaultPlan,
    open_fake_deployment,
)

# Every fault kind, with the class (or place) each must end in.
FAULTS: list[tuple[Fault, str]] = [
    (Fault(kind="status", status=503, retry_after=1), "agent_request_failed"),
    (Fault(kind="status", status=429, retry_after=2), "agent_request_failed"),
    (Fault(kind="status", status=502), "agent_request_failed"),
    (Fault(kind="status", status=500, body="Hit an exception"), "agent_run_error"),
    (Fault(kind="status", status=422, body="validation"), "agent_run_error"),
    (Fault(kind="reset_mid_request"), "agent_request_failed"),
    (Fault(kind="disconnect"), "agent_request_failed"),
    (Fault(kind="reset_mid_response"), "agent_request_failed"),
    (Fault(kind="hang"), "agent_request_failed"),
    (Fault(kind="not_json"), "agent_run_error"),
    (Fault(kind="not_object"), "agent_run_error"),
    (Fault(kind="oversized", status=500), "agent_run_error"),
    (Fault(kind="failure_class", failure_class="transient"), "transient"),
    (Fault(kind="failure_class", failure_class="skipped", terminal=True), "skipped"),
    (Fault(kind="judge_failed"), "judge_failed"),
    (Fault(kind="no_persist"), "nowhere"),
    (Fault(kind="latency", delay_s=0.05), "landed"),
    (Fault(kind="masked"), "landed"),
]


def faulty_spec(rate: float) -> DeploymentSpec:
    """A 0.7.0 deployment whose first attempts get every fault kind at `rate`."""
    plan = FaultPlan(seed=3, rate=rate, mix=tuple((fault, 1.0) for fault, _ in FAULTS))
    return DeploymentSpec(
        agents=(AgentSpec(name="math_agent"),), faults=plan, policy_seed=5, record_runs=False
    )


def expected_place(spec: DeploymentSpec, task: int, rollout: int) -> str:
    """Where the scripted fault of a rollout's first attempt must send it."""
    fault = spec.faults.fault_for(task, rollout, 0)
    if fault is None:
        return "landed"
    return next(place for f, place in FAULTS if f == fault)


@pytest.mark.slow
async def test_collect_every_rollout_ends_in_exactly_one_place(tmp_path: Path) -> None:
    """1,000 rows x 4 repeats, ~10% faults of every kind: each rollout lands once, in its place."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", 1000, seed=1)
    spec = faulty_spec(0.10)
    async with open_fake_deployment(spec) as fake:
        config = collect_config(
            source,
            tmp_path / "run" / "r.jsonl",
            fake.head_url,
            num_repeats=4,
            num_repeats_add_seed=True,
            num_samples_in_parallel=128,
            read_timeout_s=1.0,
        )
        result = await collect_run(config, live=False)
    layout = RunLayout.for_output(config.output_jsonl_fpath or "")
    materialized = read(layout.materialized_inputs)
    keys = [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in materialized]
    assert len(keys) == len(set(keys)) == result.expected == 4000

    landed = Counter((r["_ng_task_index"], r["_ng_rollout_index"]) for r in read(layout.rollouts))
    failures = {(r["_ng_task_index"], r["_ng_rollout_index"]): r for r in read(layout.failures)}
    assert max(landed.values()) == 1
    assert len(failures) == len(read(layout.failures))
    assert not set(landed) & set(failures)
    places = Counter()
    for key in keys:
        want = expected_place(spec, *key)
        places[want] += 1
        got = (
            "landed"
            if key in landed
            else failures[key]["_ng_failure_class"]
            if key in failures
            else "nowhere"
        )
        assert got == want, (key, spec.faults.fault_for(*key, 0))
    assert places["landed"] < 4000 * 0.95  # the faults really happened
    assert len(places) == len({place for _, place in FAULTS})

    status = json.loads(layout.batch_status.read_text())
    assert status["expected"] == 4000
    assert status["completed"] == len(landed)
    assert status["failed"] == len(failures)
    assert status["no_persist"] == places["nowhere"]
    assert status["finished"] is True
    assert result.progress.landed == len(landed)


def slow_spec(latency_s: float) -> DeploymentSpec:
    """A fault-free deployment whose /run takes `latency_s`."""
    return attrs.evolve(
        faulty_spec(0.0), latency=attrs.evolve(DeploymentSpec().latency, fixed_s=latency_s)
    )


def tasks_config(tmp_path: Path, head_url: str, rows: int, **settings: Any) -> RunConfig:
    """Write `rows` tasks and return a config collecting them into tmp_path/r.jsonl."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", rows, seed=rows)
    return collect_config(source, tmp_path / "r.jsonl", head_url, **settings)


async def test_collect_concurrency_reaches_and_never_exceeds_limit(tmp_path: Path) -> None:
    """The server sees at most num_samples_in_parallel /run in flight, and reaches it."""
    async with open_fake_deployment(slow_spec(0.05)) as fake:
        config = tasks_config(
            tmp_path,
            fake.head_url,
            100,
            num_repeats=3,
            num_samples_in_parallel=16,
            max_resident_rollout_tasks=24,
        )
        result = await collect_run(config, live=False)
        assert fake.stats.max_in_flight == 16
    assert result.max_resident == 24
    assert result.progress.landed == 300


async def test_collect_cancelled_run_keeps_settled_outcomes(tmp_path: Path) -> None:
    """Cancelling a run mid-way leaves every settled outcome on disk and a closed status that
    counts the rollouts never started (so it does not read as finished)."""
    hang = HangArrivals(first=30, count=20)  # 30 land, then all 20 workers hold a hung request
    async with open_fake_deployment(slow_spec(0.0), fault_fn=hang) as fake:
        config = tasks_config(tmp_path, fake.head_url, 200, num_samples_in_parallel=20)
        await cancel_when(
            partial(collect_run, config, live=False), lambda: hang.all_hanging, "20 hung requests"
        )
    layout = RunLayout.for_output(tmp_path / "r.jsonl")
    landed = read(layout.rollouts)
    status = json.loads(layout.batch_status.read_text())
    assert 0 < len(landed) < 200
    assert status["completed"] == len(landed)
    assert status["omitted"] == 20  # the rollouts in flight at the cancellation
    assert status["not_started"] == 200 - len(landed) - 20 - status["failed"]
    assert (status["closed"], status["finished"]) == (True, False)


def tag_rows(source: Path, **fields: Any) -> None:
    """Add fields to every row of a JSONL file."""
    rows = [{**row, **fields} for row in jsonl.read_rows(source)]
    source.write_bytes(b"".join(jsonl.dumps(row) for row in rows))


async def test_collect_local_metrics_equal_the_servers_over_loopback(tmp_path: Path) -> None:
    """At the end of a run, local default metrics equal each server's /aggregate_metrics."""
    spec = attrs.evolve(
        slow_spec(0.0), agents=(AgentSpec(name="math_agent"), AgentSpec(name="string_agent"))
    )
    async with open_fake_deployment(spec) as fake:
        config = tasks_config(
            tmp_path,
            fake.head_url,
            60,
            num_repeats=3,
            num_repeats_add_seed=True,
            fan_out={"both": ["math_agent", "string_agent"]},
        )
        tag_rows(Path(config.input_jsonl_fpath or ""), task_source="both")
        result = await collect_run(attrs.evolve(config, agent_name=None), live=False)
    assert result.aggregate is not None
    assert result.aggregate.ok
    entries = json.loads(result.layout.aggregate_metrics.read_text())
    assert {e["agent_ref"]["name"] for e in entries} == {"math_agent", "string_agent"}
    for entry in entries:
        server, local = entry["agent_metrics"], entry["trollout"]["local_agent_metrics"]
        assert entry["trollout"]["metrics_source"] == "server"
        assert set(local) <= set(server)
        assert local == {k: pytest.approx(server[k], rel=1e-9) for k in local}
        assert local["mean/reward"] > 0
