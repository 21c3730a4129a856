"""Rewards a buggy grader gives (``1e308`` beside ``0.0``): scoring never crashes.

Before, ``math.fsum`` and ``**`` raised ``OverflowError`` at the end of ``collect`` and in every
later ``aggregate``, losing the run's metrics and report. Now every statistic is computed as
before where it fits the float range (the same numbers, bit for bit), exactly where its sums do
not, and is infinite (JSON null: not computable) only when its own value is beyond the range.
The estimators are tried on any floats at all (hypothesis), and the whole path through the CLI:
``collect`` against the fake deployment whose grader gives ``1e308``, then ``aggregate``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Sequence
from fractions import Fraction
from pathlib import Path

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from builders import invoke, read_jsonl, write_jsonl
from trollout.metrics.estimators import (
    bootstrap_intervals,
    cluster_standard_error,
    describe,
    sample_std,
    standard_error,
)
from trollout.metrics.stats import metric_columns
from trollout.metrics.streaming import describe_chunks
from trollout.metrics.summary import histogram
from trollout.metrics.views import TaskRewards, summarize_view
from trollout.records import Identity, Landed, outcome_to_row
from trollout.testing import AgentSpec, DeploymentSpec, spawn_fake_deployment, task_rows

any_floats = st.floats(allow_nan=True, allow_infinity=True)
moderate = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


def chunked(values: Sequence[float], size: int = 3) -> Callable[[], Iterator[Sequence[float]]]:
    """Return a chunk factory over ``values``."""

    def chunks() -> Iterator[Sequence[float]]:
        for start in range(0, len(values), size):
            yield values[start : start + size]

    return chunks


@given(st.lists(any_floats, min_size=1, max_size=30))
@example([1e308, 1e308, -1e308, 0.0])
@example([math.inf, -math.inf, math.nan, 1e308])
def test_no_estimator_raises_on_any_floats(values: list[float]) -> None:
    """Finite, huge, infinite or NaN: every estimator returns, none raises."""
    describe(values)
    describe_chunks(chunked(values))
    histogram(chunked([v for v in values if math.isfinite(v)]))  # `stats` keeps no other
    sample_std(values) if len(values) > 1 else None
    cluster_standard_error((1, v, 2) for v in values)
    standard_error((1, v) for v in values)
    bootstrap_intervals(
        [1] * len(values), [[(v, 1.0) for v in values]], samples=20, rng=random.Random(0), level=0.9
    )
    tasks = [TaskRewards.of([v, 0.0]) for v in values]
    summarize_view("any", tasks, samples=20)
    summarize_view("any", tasks, samples=0)


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=30))
@example([1e308, 1e308, 0.0, -1e-300])
def test_statistics_of_finite_floats_are_exact_or_infinite(values: list[float]) -> None:
    """Any finite floats: the mean and median are finite and exact to one rounding (1e308
    beside 0.0 has the mean 5e307); the std is finite or, only past the range, inf."""
    stats = describe(values)
    exact = sum(map(Fraction, values), Fraction(0)) / len(values)
    assert math.isfinite(stats.mean)
    assert stats.mean == pytest.approx(float(exact), rel=1e-15)
    assert min(values) <= stats.median <= max(values)
    assert stats.std is None or not math.isnan(stats.std)


def old_describe(values: Sequence[float]) -> tuple[float, float]:
    """The mean and median as computed before (fsum over n; the two middle values halved)."""
    data = sorted(values)
    n, mid = len(data), len(data) // 2
    median = data[mid] if n % 2 else (data[mid - 1] + data[mid]) / 2
    return math.fsum(data) / n, median


def old_cluster_se(tasks: Sequence[tuple[int, float, int]]) -> float:
    """The task-clustered standard error as computed before."""
    n_tasks = sum(c for c, _, _ in tasks)
    rollouts = sum(c * n for c, _, n in tasks)
    mean = math.fsum(c * s for c, s, _ in tasks) / rollouts
    spread = math.fsum(c * (s - mean * n) ** 2 for c, s, n in tasks)
    return math.sqrt(n_tasks / (n_tasks - 1) * spread) / rollouts


def old_standard_error(pairs: Sequence[tuple[int, float]]) -> float:
    """The standard error over tasks as computed before."""
    n = sum(c for c, _ in pairs)
    mean = math.fsum(c * v for c, v in pairs) / n
    return math.sqrt(math.fsum(c * (v - mean) ** 2 for c, v in pairs) / (n - 1) / n)


@given(st.lists(moderate, min_size=2, max_size=30))
def test_moderate_inputs_give_the_same_numbers_as_before(values: list[float]) -> None:
    """Moderate rewards: the numbers are those of the formulas before, bit for bit."""
    stats = describe(values)
    mean, median = old_describe(values)
    assert (stats.mean, stats.median) == (mean, median) or len(set(values)) == 1
    tasks = [(1, v, 2) for v in values]
    assert cluster_standard_error(tasks) == old_cluster_se(tasks)
    pairs = [(1, v) for v in values]
    assert standard_error(pairs) == old_standard_error(pairs)


def test_large_columns_take_the_exact_path_when_streaming_overflows() -> None:
    """Over 65,536 values (the streaming passes): 1e308s whose sum overflows, and a spread
    from -1e308 to 1e308, are described exactly, like `describe` on one list."""
    few = [1e308] * 40_000 + [0.0] * 40_000
    stats = describe_chunks(chunked(few, 4096))
    assert stats is not None
    assert (stats.mean, stats.median, stats.max) == (5e307, 5e307, 1e308)
    assert stats.std == describe(few).std
    spread = [1e308, -1e308] + [i / 7 for i in range(70_000)]
    stats = describe_chunks(chunked(spread, 4096))
    assert stats == describe(spread)
    assert stats is not None
    assert math.isfinite(stats.mean)
    assert stats.std is not None
    assert math.isfinite(stats.std)


def test_a_histogram_spanning_the_whole_float_range_has_its_bins() -> None:
    """-1e308 to 1e308 (a spread past the range) in many distinct values: 20 bins, every
    value counted, the labels finite."""
    values = [-1e308, 1e308, *(i * 1e306 for i in range(30))]
    found = histogram(chunked(values))
    assert found is not None
    assert sum(found.counts) == len(values)
    assert len(found.labels) == 20
    assert all(math.isfinite(float(label)) for label in found.labels)


def test_a_view_of_huge_rewards_reports_what_it_can() -> None:
    """1e308 beside 0.0 over tasks: the mean is exact (1e308 / 2 / 2 over two rollouts a
    task, half of the tasks), its error and interval finite; nothing raises."""
    tasks = [TaskRewards.of([1e308 if t % 2 else 0.0, 0.0]) for t in range(10)]
    view = summarize_view("huge", tasks, samples=200)
    assert view.mean_reward is not None
    assert view.mean_reward.value == 2.5e307
    assert view.mean_reward.std_error is not None
    assert math.isfinite(view.mean_reward.std_error)
    assert view.mean_reward.interval is not None
    assert view.mean_reward.interval.low <= 2.5e307 <= view.mean_reward.interval.high


def test_a_value_that_is_not_finite_is_not_a_metric_column() -> None:
    """NaN, inf or an int past the float range (an embedding driver's row): not a number,
    as JSON would write it (null), so the reward is unscored rather than poisoning sums."""
    row = {"reward": math.inf, "a": math.nan, "b": 10**400, "c": 1e308, "d": 2}
    assert metric_columns(row) == {"c": 1e308, "d": 2.0}


def test_collect_and_aggregate_survive_a_grader_giving_1e308(tmp_path: Path) -> None:
    """The fake's grader gives 1e308 to some rows, 0.0 to others: collect ends with its
    metrics and report (exit 0, the mean reward reported), and aggregate does again."""
    rows = list(task_rows(6, seed=3))
    for i, row in enumerate(rows):
        row["fake_reward"] = 1e308 if i % 2 else 0.0
    source = write_jsonl(tmp_path / "tasks.jsonl", rows)
    out = tmp_path / "run" / "r.jsonl"
    spec = DeploymentSpec(agents=(AgentSpec(name="math_agent"),))
    with spawn_fake_deployment(spec) as fake:
        result = invoke(
            "collect", str(source), "-o", str(out), "--head-server", fake.head_url,
            "--agent", "math_agent", "--num-repeats", "2", "--progress", "plain",
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert sorted(r["reward"] for r in read_jsonl(out)) == [0.0] * 6 + [1e308] * 6
    metrics = tmp_path / "run" / "r_aggregate_metrics.json"
    (entry,) = orjson.loads(metrics.read_bytes())
    ours = entry["trollout"]
    assert ours["local_agent_metrics"]["mean/reward"] == 5e307
    assert ours["local_agent_metrics"]["median/reward"] == 5e307
    assert ours["failures_excluded"]["mean_reward"]["value"] == 5e307
    assert ours["failures_as_zero"]["mean_reward"]["std_error"] > 0
    assert (tmp_path / "run" / "r_report.html").is_file()
    again = invoke("aggregate", str(out), "--json", "--no-report")
    assert again.exit_code == 0, again.output
    report = orjson.loads(again.output)
    (group,) = report["groups"]
    assert group["failures_excluded"]["mean_reward"]["value"] == 5e307
    assert group["local_agent_metrics"]["mean/reward"] == 5e307


def test_aggregate_of_rollouts_files_with_1e308_rewards_writes_metrics_and_report(
    tmp_path: Path,
) -> None:
    """Rollouts files (no deployment) holding 1e308 and 0.0 rewards: ``trollout aggregate``
    exits 0 with the exact mean, the metrics file and the report (an OverflowError before)."""
    rows, plan = [], []
    for task in range(4):
        for rollout in range(2):
            ident = Identity(task, rollout, agent_name="a")
            plan.append({"responses_create_params": {"input": f"q{task}"}, **ident.stamps()})
            reward = 1e308 if task % 2 else 0.0
            rows.append(outcome_to_row(Landed(ident, 0, {"reward": reward}, 0.5)))
    write_jsonl(tmp_path / "r.jsonl", rows)
    write_jsonl(tmp_path / "r_materialized_inputs.jsonl", plan)
    result = invoke("aggregate", str(tmp_path / "r.jsonl"), "--json")
    assert result.exit_code == 0, result.output
    (group,) = orjson.loads(result.output)["groups"]
    assert group["failures_excluded"]["mean_reward"]["value"] == 5e307
    assert group["local_agent_metrics"]["mean/reward"] == 5e307
    assert (tmp_path / "r_aggregate_metrics.json").is_file()
    assert (tmp_path / "r_report.html").is_file()
