"""NeMo Gym's exporter names in the metrics file: failure and retry counts, the masking view."""

from __future__ import annotations

from pathlib import Path

from run_folders import failed, landed, omitted, plan_for, read_metrics, write_run

from trollout.metrics import AggregateOptions, aggregate_shards


def capped(row: dict[str, object], cap: int) -> dict[str, object]:
    """Return a sidecar row recording the attempt cap its collection had."""
    return {**row, "_ng_failure_max_attempts": cap}


async def test_metrics_file_exports_failures_retries_and_masking(tmp_path: Path) -> None:
    """Each entry carries coverage/failed/<class>, retries/* and progress/<agent>/*."""
    rows = [landed(0, 0, 1.0), landed(1, 0, 0.0, mask_sample=True), landed(2, 0, 0.5, attempt=1)]
    failures = [
        capped(failed(2, 0, "transient"), 3),  # then landed: retried
        capped(failed(3, 0, "judge_failed"), 2),
        capped(failed(3, 0, "judge_failed", attempt=1), 2),  # at its cap
        capped(failed(4, 0, "agent_run_error", attempt=0), 2),
        omitted(4, 0, attempt=1),  # the latest execution: no class counted
    ]
    layout = write_run(tmp_path / "r.jsonl", rows, failures=failures, plan=plan_for(5, 1))
    result = await aggregate_shards([layout.output], options=AggregateOptions(max_attempts=3))
    (entry,) = read_metrics(layout)
    assert entry["export_metrics"] == {
        "coverage/failed/judge_failed": 1,
        "retries/attempts": 4,
        "retries/rollouts_retried": 2,
        "retries/at_cap": 1,
        "progress/agent_a/masked_pct": 33.33,
        "progress/agent_a/reward_unmasked": 75.0,
        "progress/agent_a/failed": 1,
        "progress/agent_a/omitted": 1,
    }  # retries/max_attempts left out: rollouts recorded caps 3 and 2
    assert result.groups[0].exports == entry["export_metrics"]


async def test_healthy_run_exports_no_masking_view(tmp_path: Path) -> None:
    """Nothing masked or dropped: the masking view is empty; the cap is the current one."""
    layout = write_run(tmp_path / "r.jsonl", [landed(0, 0)], plan=plan_for(1, 1))
    await aggregate_shards([layout.output], options=AggregateOptions(max_attempts=5))
    (entry,) = read_metrics(layout)
    assert entry["export_metrics"] == {
        "retries/attempts": 0,
        "retries/rollouts_retried": 0,
        "retries/at_cap": 0,
        "retries/max_attempts": 5,
    }
