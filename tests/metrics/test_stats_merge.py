"""Per-task state: metric columns, and merging per-shard states equals the union (any split)."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from trollout.metrics.default_metrics import agent_metrics, group_level_metrics
from trollout.metrics.stats import GroupStats, TaskStats, is_masked, metric_columns
from trollout.metrics.views import TaskRewards, summarize_view


def test_metric_columns_follow_nemo_gym_rules() -> None:
    """Top-level numbers and usage numbers; booleans 0/1; _keys and mask_sample left out."""
    row = {
        "reward": 1,
        "terminated": True,
        "info": {"x": 1},
        "name": "n",
        "_ng_task_index": 3,
        "mask_sample": False,
        "input_tokens": "clash",
        "response": {"usage": {"input_tokens": 7, "output_tokens": 2, "details": {"a": 1}}},
    }
    assert metric_columns(row) == {
        "reward": 1.0,
        "terminated": 1.0,
        "input_tokens": 7.0,
        "output_tokens": 2.0,
    }
    assert list(metric_columns(row)) == ["reward", "terminated", "input_tokens", "output_tokens"]
    assert is_masked({"mask_sample": True})
    assert not is_masked(row)


def test_task_stats_widens_schema_with_nan_padding() -> None:
    """Rows with different columns keep every value under one widened schema."""
    state = TaskStats()
    state.add({"a": 1.0}, ("a",))
    state.add({"b": 2.0, "a": 3.0}, ("b", "a"))
    state.add({}, ())
    assert state.schema == ("a", "b")
    assert state.values("a") == [1.0, 3.0]
    assert state.values("b") == [2.0]
    assert state.rows == 3
    assert state.values("missing") == []


@st.composite
def rollout_rows(draw: st.DrawFn) -> list[tuple[int, int, dict[str, float], bool]]:
    """Draw rows (task, rollout, columns, masked) with unique (task, rollout) keys."""
    keys = draw(
        st.lists(
            st.tuples(st.integers(0, 6), st.integers(0, 5)), min_size=1, max_size=40, unique=True
        )
    )
    binary = draw(st.booleans())
    rows = []
    for task, rollout in keys:
        columns: dict[str, float] = {}
        if draw(st.integers(0, 9)):
            columns["reward"] = (
                float(draw(st.integers(0, 1))) if binary else draw(st.floats(-5, 5, width=32))
            )
        columns["input_tokens"] = float(draw(st.integers(0, 500)))
        if draw(st.booleans()):
            columns["elapsed_seconds"] = draw(st.floats(0, 100, allow_subnormal=False))
        rows.append((task, rollout, columns, draw(st.integers(0, 11)) == 0))
    return rows


def build(rows: list[tuple[int, int, dict[str, float], bool]]) -> GroupStats:
    """Return the state of a group fed ``rows`` in order."""
    group = GroupStats()
    for task, rollout, columns, masked in rows:
        group.add_row(task, rollout, columns, masked=masked)
    return group


def everything(group: GroupStats) -> dict[str, Any]:
    """Return every statistic reported from a group's state."""
    view = summarize_view(
        "v", (TaskRewards.of(s.values("reward")) for s in group.tasks.values()), samples=20
    )
    return {
        "agent": agent_metrics(group),
        "tasks": list(group_level_metrics(group)),
        "view": view,
        "order": group.column_order(),
    }


@given(rollout_rows(), st.integers(1, 5), st.randoms(use_true_random=False))
def test_merged_shards_equal_the_union(
    rows: list[tuple[int, int, dict[str, float], bool]], shards: int, rng: random.Random
) -> None:
    """Merging per-shard states gives exactly the statistics of the union, for any split."""
    split: list[list[Any]] = [[] for _ in range(shards)]
    for row in rows:
        split[rng.randrange(shards)].append(row)
    merged = GroupStats()
    for part in split:
        rng.shuffle(part)
        merged.merge(build(part))
    assert everything(merged) == everything(build(rows))


@given(rollout_rows(), st.randoms(use_true_random=False))
def test_statistics_ignore_arrival_order(
    rows: list[tuple[int, int, dict[str, float], bool]], rng: random.Random
) -> None:
    """Rows arriving in completion order give the same statistics as rows in key order."""
    shuffled = list(rows)
    rng.shuffle(shuffled)
    assert everything(build(shuffled)) == everything(build(sorted(rows, key=lambda r: r[:2])))
