"""Coverage and honesty: latest failures, recovered rollouts, imputed zeros, the report lines."""

from __future__ import annotations

from pathlib import Path

from run_folders import failed, landed, omitted, plan_for, planned, read_metrics, write_run

from trollout.metrics import (
    AggregateOptions,
    AggregateResult,
    Coverage,
    aggregate_run,
    aggregate_shards,
)
from trollout.metrics.coverage import coverage_lines


async def run(
    tmp_path: Path, rows: list, failures: list, plan: list | None = None, **options: object
) -> AggregateResult:
    """Aggregate one run folder with the given options."""
    layout = write_run(tmp_path / "run.jsonl", rows, failures=failures, plan=plan)
    return await aggregate_shards([layout.output], options=AggregateOptions(**options))  # type: ignore[arg-type]


async def test_failed_then_landed_counts_once_as_landed(tmp_path: Path) -> None:
    """A rollout with a failure and a landed row is landed, reported as recovered."""
    result = await run(
        tmp_path,
        [landed(0, 0), landed(1, 0)],
        [failed(0, 0, "agent_request_failed"), failed(1, 1, "agent_run_error")],
        plan_for(2, 2),
        count_failure_classes_as_zero=frozenset({"agent_request_failed"}),
    )
    cov = result.groups[0].coverage
    assert (cov.expected, cov.landed, cov.recovered) == (4, 2, 1)
    assert cov.failed == {"agent_run_error": 1}
    assert cov.missing == 1
    assert cov.imputed == {}
    assert result.groups[0].excluded.rollouts == 2
    assert result.groups[0].as_zero.rollouts == 4


async def test_latest_failure_across_classes_stands(tmp_path: Path) -> None:
    """The failure with the highest attempt decides the class, whatever the file order."""
    failures = [
        failed(0, 0, "transient", attempt=0),
        failed(0, 0, "judge_failed", attempt=2),
        failed(0, 0, "agent_request_failed", attempt=1),
    ]
    kept = await run(
        tmp_path / "a", [], failures, count_failure_classes_as_zero=frozenset({"judge_failed"})
    )
    assert kept.groups[0].coverage.failed == {"judge_failed": 1}
    assert kept.groups[0].coverage.imputed == {"judge_failed": 1}
    older = await run(
        tmp_path / "b", [], failures, count_failure_classes_as_zero=frozenset({"transient"})
    )
    assert older.groups[0].coverage.imputed == {}


async def test_omitted_row_hides_older_failures(tmp_path: Path) -> None:
    """An interrupted attempt makes the rollout missing, so its old failure is not imputed."""
    failures = [failed(0, 0, "agent_run_error", attempt=0), omitted(0, 0, attempt=1)]
    options = {"count_failure_classes_as_zero": frozenset({"agent_run_error"})}
    result = await run(tmp_path / "a", [landed(1, 0)], failures, plan_for(2, 1), **options)
    cov = result.groups[0].coverage
    assert (cov.omitted, cov.failed, cov.imputed) == (1, {}, {})
    zeroed = await run(
        tmp_path / "b",
        [landed(1, 0)],
        failures,
        plan_for(2, 1),
        count_missing_rollouts_as_zero=True,
    )
    assert zeroed.groups[0].coverage.imputed == {"omitted": 1}
    assert zeroed.groups[0].local_metrics["mean/reward"] == 0.5


async def test_drained_row_does_not_supersede(tmp_path: Path) -> None:
    """A never-started attempt leaves the earlier failure standing."""
    failures = [failed(0, 0, "agent_run_error", attempt=0), omitted(0, 0, attempt=1, drained=True)]
    result = await run(tmp_path, [], failures)
    assert result.groups[0].coverage.failed == {"agent_run_error": 1}


async def test_imputed_rows_take_task_fields_from_the_plan(tmp_path: Path) -> None:
    """A kept failure enters as reward 0 with the plan's task fields; files are unchanged."""
    plan = [planned(0, 0, level=2), planned(0, 1, level=2), planned(1, 0, level=5)]
    rows = [landed(0, 0, 1.0, level=2)]
    failures = [failed(0, 1, "agent_run_error"), failed(1, 0, "judge_failed", reward=0.25)]
    layout = write_run(tmp_path / "run.jsonl", rows, failures=failures, plan=plan)
    before = [layout.rollouts.read_bytes(), layout.failures.read_bytes()]
    options = AggregateOptions(
        count_failure_classes_as_zero=frozenset({"agent_run_error", "judge_failed"})
    )
    result = await aggregate_shards([layout.output], options=options)
    metrics = result.groups[0].local_metrics
    assert metrics["mean/reward"] == (1.0 + 0.0 + 0.25) / 3
    assert metrics["mean/level"] == 3.0
    assert metrics["max/input_tokens"] == 100.0  # failures carry no usage
    assert [layout.rollouts.read_bytes(), layout.failures.read_bytes()] == before
    (entry,) = read_metrics(layout)
    assert entry["agent_metrics"] == metrics
    assert [t["num_rollouts"] for t in entry["group_level_metrics"]] == [2, 1]


async def test_counts_as_zero_marker_counts_without_the_option(tmp_path: Path) -> None:
    """A row its producer marked _ng_failure_counts_as_zero is a scored zero, option or not."""
    failures = [failed(0, 0, "legitimate", _ng_failure_counts_as_zero=True)]
    for folder, options in (("a", {}), ("b", {"count_failure_classes_as_zero": frozenset()})):
        result = await run(tmp_path / folder, [landed(1, 0)], failures, **options)
        assert result.groups[0].coverage.imputed == {"legitimate": 1}
        assert result.groups[0].local_metrics["mean/reward"] == 0.5


async def test_legacy_producer_class_matches_count_failure_classes(tmp_path: Path) -> None:
    """count_failure_classes_as_zero matches the producer's original class too."""
    failures = [failed(0, 0, "agent_run_error", _ng_failure_legacy_class="judge_failed")]
    result = await run(
        tmp_path,
        [landed(1, 0)],
        failures,
        count_failure_classes_as_zero=frozenset({"judge_failed"}),
    )
    assert result.groups[0].coverage.imputed == {"agent_run_error": 1}


async def test_counted_failure_row_leaves_diagnostics_out(tmp_path: Path) -> None:
    """A counted row enters unmasked, without failure_kind, failure_reason or _ng_failure_*."""
    failures = [
        failed(0, 0, "x", failure_reason="boom", mask_sample=True, status_code=500, level=2)
    ]
    result = await run(
        tmp_path, [landed(1, 0, level=4)], failures, count_failure_classes_as_zero=frozenset({"x"})
    )
    metrics = result.groups[0].local_metrics
    assert metrics["mean/reward"] == 0.5  # the masked row still counts: the row is unmasked
    assert metrics["mean/level"] == 3.0
    assert "mean/status_code" in metrics  # a producer's own number is data
    assert not any("http_status" in key for key in metrics)


async def test_missing_rollouts_as_zero(tmp_path: Path) -> None:
    """Planned rollouts with no row enter as reward 0 only when asked."""
    plain = await run(tmp_path / "a", [landed(0, 0)], [], plan_for(1, 4))
    assert plain.groups[0].coverage.missing == 3
    assert plain.groups[0].local_metrics["mean/reward"] == 1.0
    zeroed = await run(
        tmp_path / "b", [landed(0, 0)], [], plan_for(1, 4), count_missing_rollouts_as_zero=True
    )
    assert zeroed.groups[0].coverage.imputed == {"no row": 3}
    assert zeroed.groups[0].local_metrics["mean/reward"] == 0.25
    assert zeroed.groups[0].as_zero.mean_reward is not None
    assert zeroed.groups[0].as_zero.mean_reward.value == 0.25


def test_coverage_lines_say_what_is_left_out() -> None:
    """The report names the rollouts not scored by class, and the imputed zeros."""
    cov = Coverage(
        expected=10, landed=7, scored=6, unscored=1, failed={"agent_run_error": 2}, missing=1
    )
    assert coverage_lines(cov) == [
        "Metrics cover: 6 of 10 rollouts",
        "  not scored: agent_run_error 2, no row 1, unscored 1",
    ]
    assert cov.did_not_land() == {"agent_run_error": 2, "no row": 1}
    zeroed = Coverage(expected=3, landed=2, scored=2, failed={"x": 1}, imputed={"x": 1})
    assert coverage_lines(zeroed) == ["Metrics cover: 3 of 3 rollouts", "  imputed zeros: x 1"]
    assert coverage_lines(Coverage(expected=2, landed=2, scored=2)) == [
        "Metrics cover: 2 of 2 rollouts"
    ]


async def test_aggregate_run_without_a_rollouts_file(tmp_path: Path) -> None:
    """A run where nothing landed yet (no rollouts file) is aggregated: all planned, none scored."""
    layout = write_run(tmp_path / "run.jsonl", [], failures=[failed(0, 0)], plan=plan_for(2, 1))
    layout.rollouts.unlink()
    result = await aggregate_run(layout)
    assert result.metrics_path == layout.aggregate_metrics
    cov = result.coverage
    assert (cov.expected, cov.landed, cov.failed, cov.missing) == (2, 0, {"agent_run_error": 1}, 1)
    (entry,) = read_metrics(layout)
    assert entry["agent_metrics"] == {}
    assert entry["group_level_metrics"] == []
    assert entry["trollout"]["failures_as_zero"]["rollouts"] == 2
