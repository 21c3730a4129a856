"""NeMo Gym settings end to end: real ``collect`` and ``aggregate`` runs against the fake."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from builders import invoke, read_jsonl, write_jsonl
from trollout.testing import AgentSpec, DeploymentSpec, FakeUrls

AGENTS = ("agent_a", "agent_b")


@pytest.fixture(scope="module")
def fake_spec() -> DeploymentSpec:
    """Unlike the shared fake's: a fake 0.7.0 deployment with agent_a and agent_b."""
    return DeploymentSpec(agents=tuple(AgentSpec(name=a) for a in AGENTS))


def rows(n: int, agent: str, **extra: Any) -> list[dict[str, Any]]:
    """Return n questions routed to ``agent``."""
    return [
        {
            "responses_create_params": {
                "input": [{"role": "user", "content": f"What is {i} + 1?"}]
            },
            "expected_answer": str(i + 1),
            "agent_ref": {"name": agent},
            **extra,
        }
        for i in range(n)
    ]


def collect(fake: FakeUrls, source: Path, out: Path, *tokens: str) -> Any:
    """Run ``trollout collect`` against the fake; return click's result."""
    return invoke(
        "collect", str(source), "-o", str(out), "--head-server", fake.head_url,
        "--progress", "plain", *tokens,
    )  # fmt: skip


def test_per_agent_seeds_and_the_manifest_records_the_mapping(
    fake: FakeUrls, tmp_path: Path
) -> None:
    """+num_repeats_add_seed={agent_a:false} seeds no agent_a rollout; the manifest keeps it."""
    source = write_jsonl(tmp_path / "in.jsonl", rows(2, "agent_a") + rows(2, "agent_b"))
    for setting, seeded in (
        ("{agent_a:false}", {"agent_a": False, "agent_b": False}),
        ("{agent_a:false,_default:true}", {"agent_a": False, "agent_b": True}),
    ):
        out = tmp_path / f"run{setting.count(',')}" / "r.jsonl"
        result = collect(fake, source, out, "+num_repeats=2", f"+num_repeats_add_seed={setting}")
        assert result.exit_code == 0, result.output
        plan = read_jsonl(out.with_name("r_materialized_inputs.jsonl"))
        found: dict[str, set[bool]] = {}
        for row in plan:
            metadata = row["responses_create_params"].get("metadata", {})
            found.setdefault(row["agent_ref"]["name"], set()).add("extra_body" in metadata)
        assert found == {agent: {flag} for agent, flag in seeded.items()}
        manifest = orjson.loads(out.with_name("r_manifest.json").read_bytes())
        assert manifest["settings"]["num_repeats_add_seed"] == json.loads(
            setting.replace("agent_a", '"agent_a"').replace("_default", '"_default"')
        )


def test_own_way_keys_are_noted_and_the_run_goes_on(fake: FakeUrls, tmp_path: Path) -> None:
    """route_failures_to_sidecar and retain_results_in_memory: one note each, then the run."""
    source = write_jsonl(tmp_path / "in.jsonl", rows(1, "agent_a"))
    out = tmp_path / "out" / "r.jsonl"
    tokens = ("+route_failures_to_sidecar=true", "+retain_results_in_memory=false")
    result = collect(fake, source, out, *tokens, "+skills=null", "+upload_rollouts=false")
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if line.startswith("trollout: note:")]
    assert [n.split(":")[2].strip() for n in notes] == [
        "retain_results_in_memory",
        "route_failures_to_sidecar",
    ]
    assert len(read_jsonl(out)) == 1
    assert "differs from NeMo Gym: a request silent for 3600s fails" in result.stdout


def test_resubmit_true_resumes_and_sends_terminal_failures_again(
    fake: FakeUrls, tmp_path: Path
) -> None:
    """+resubmit=true resumes the run and sends a terminally failed rollout once more."""
    fault = {"kind": "failure_class", "failure_class": "skipped", "terminal": True, "attempts": [0]}
    failing = rows(1, "agent_a", fake_fault=fault)
    source = write_jsonl(tmp_path / "in.jsonl", failing + rows(1, "agent_b"))
    out = tmp_path / "out" / "r.jsonl"
    first = collect(fake, source, out)
    assert first.exit_code == 0, first.output
    assert len(read_jsonl(out)) == 1
    again = collect(fake, source, out, "+resubmit=true")
    assert again.exit_code == 0, again.output
    assert len(read_jsonl(out)) == 2
    assert [r.get("_ng_attempt_index", 0) for r in read_jsonl(out)] == [0, 1]


def manifest_file(path: Path, members: dict[str, Any]) -> Path:
    """Write a NeMo Gym batch manifest."""
    path.write_text(json.dumps({"schema_version": "1", "members": members}))
    return path


def test_batch_manifest_is_checked_then_status_is_written(fake: FakeUrls, tmp_path: Path) -> None:
    """Members are checked before dispatch; batch_status.json follows collect and aggregate."""
    source = write_jsonl(tmp_path / "in.jsonl", rows(2, "agent_a") + rows(1, "agent_b"))
    out = tmp_path / "out" / "r.jsonl"
    wrong = manifest_file(
        tmp_path / "wrong.json",
        {"a": {"agent_name": "agent_a", "expected_rollout_count": 5}},
    )
    refused = collect(fake, source, out, f"+batch_manifest_fpath={wrong}")
    assert refused.exit_code == 2
    assert "member 'a' declares 5 rollouts, the plan has 2" in refused.output
    assert "agent 'agent_b', which no member declares" in refused.output
    assert not out.parent.exists()
    (tmp_path / "batch").mkdir()
    batch = manifest_file(
        tmp_path / "batch" / "batch_manifest.json",
        {
            "a": {"agent_name": "agent_a", "expected_task_count": 2, "expected_rollout_count": 2},
            "b": {"agent_name": "agent_b"},
        },
    )
    result = collect(fake, source, out, f"+batch_manifest_fpath={batch}")
    assert result.exit_code == 0, result.output
    status = orjson.loads((batch.parent / "batch_status.json").read_bytes())["members"]
    assert status["agent_a"] == {
        "member": "a",
        "expected_rollout_count": 2,
        "completed_rollout_count": 2,
        "remaining_rollout_count": 0,
        "failures_by_class": {},
        "aggregation_status": "ok",
    }
    assert status["agent_b"]["completed_rollout_count"] == 1
    (batch.parent / "batch_status.json").unlink()
    aggregated = invoke(
        "aggregate", str(out), "--no-report", f"+batch_manifest_fpath={batch}",
        "+merge_shards=false",
    )  # fmt: skip
    assert aggregated.exit_code == 0, aggregated.output
    status = orjson.loads((batch.parent / "batch_status.json").read_bytes())["members"]
    assert status["agent_b"]["aggregation_status"] == "ok"


def test_aggregate_retry_terminal_timeouts_counts_a_timed_out_rollout_as_remaining(
    fake: FakeUrls, tmp_path: Path
) -> None:
    """Aggregate's +retry_terminal_timeouts: a terminal timeout is work left in batch_status."""
    fault = {
        "kind": "failure_class", "failure_class": "timeout_exceeded", "terminal": True,
        "attempts": [0],
    }  # fmt: skip
    source = write_jsonl(tmp_path / "in.jsonl", rows(1, "agent_a", fake_fault=fault))
    out = tmp_path / "out" / "r.jsonl"
    assert collect(fake, source, out, "+disable_aggregation=true").exit_code == 0
    (tmp_path / "batch").mkdir()
    batch = manifest_file(
        tmp_path / "batch" / "batch_manifest.json", {"a": {"agent_name": "agent_a"}}
    )
    remaining = {}
    for retry in ("false", "true"):
        aggregated = invoke(
            "aggregate", str(out), "--no-report", f"+batch_manifest_fpath={batch}",
            "+merge_shards=false", f"+retry_terminal_timeouts={retry}",
        )  # fmt: skip
        assert aggregated.exit_code == 0, aggregated.output
        status = orjson.loads((batch.parent / "batch_status.json").read_bytes())["members"]
        assert status["agent_a"]["failures_by_class"] == {"timeout_exceeded": 1}
        remaining[retry] = status["agent_a"]["remaining_rollout_count"]
    assert remaining == {"false": 0, "true": 1}


def test_resume_reads_the_settings_a_run_saved_before_this_version(tmp_path: Path) -> None:
    """A manifest saved by an earlier version (no judgement of the start window, no new
    keys) still gives a config to resume with."""
    from trollout.cli.resume import config_from_run

    out = tmp_path / "r.jsonl"
    settings = {
        "input_jsonl_fpath": str(tmp_path / "in.jsonl"),
        "output_jsonl_fpath": str(out),
        "dispatch_start_report_within_s": 60.0,
        "dispatch_start_report_min_fraction": None,
        "round_robin_agents": False,
        "num_repeats_add_seed": True,
        "task_ids": [0, 2],
    }
    manifest = {
        "run_id": "r",
        "trollout_version": "0.1.0",
        "created_at": 0.0,
        "input_sha256": "",
        "settings_sha256": "",
        "deployment_sha256": "",
        "expected_rollouts": 1,
        "tasks": 1,
        "settings": settings,
    }
    out.with_name("r_manifest.json").write_bytes(orjson.dumps(manifest))
    config = config_from_run(str(out), {}, ())
    assert config.dispatch_start_report_min_fraction == 0.9
    assert config.round_robin_agents is False
    assert config.resume_from_cache is True
