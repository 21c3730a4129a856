"""Local default metrics equal NeMo Gym's: the reference file, and the fake deployment's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from run_folders import planned, read_metrics, write_run

from trollout.metrics import aggregate_shards
from trollout.metrics.default_metrics import agent_metrics, group_level_metrics, key_metrics
from trollout.metrics.stats import GroupStats, is_masked, metric_columns
from trollout.testing.aggregate import aggregate_metrics as fake_aggregate_metrics

REFERENCE = Path(__file__).parents[3] / "shared/reference/nemo_gym_0.7.0"
REFERENCE_METRICS = REFERENCE / "rollouts_aggregate_metrics.json"
_BOOKKEEPING = {"sample", "rollout_infos", "expected_num_rollouts", "missing_num_rollouts"}
_BOOKKEEPING |= {"reward_profile_completion_pct"}


def reference_entry() -> dict[str, Any]:
    """Return the reference metrics file's only entry (skip when the folder is absent)."""
    if not REFERENCE_METRICS.is_file():
        pytest.skip(f"{REFERENCE} is absent")
    entries: list[dict[str, Any]] = orjson.loads(REFERENCE_METRICS.read_bytes())
    return entries[0]


def rows_from_rollout_infos(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """Rebuild the rows NeMo Gym aggregated from the per-rollout infos it wrote."""
    rows = []
    for task in entry["group_level_metrics"]:
        for info in task["rollout_infos"]:
            usage = {k: info[k] for k in ("input_tokens", "output_tokens", "total_tokens")}
            rows.append(
                {
                    "responses_create_params": {"input": []},
                    "response": {"output": [], "usage": usage},
                    "reward": info["reward"],
                    "mask_sample": False,
                    "_ng_task_index": info["_ng_task_index"],
                    "_ng_rollout_index": info["_ng_rollout_index"],
                    "agent_ref": entry["agent_ref"],
                    "_ng_environment_server": entry["_ng_environment_server"],
                }
            )
    return rows


async def test_reference_agent_metrics_are_recomputed_exactly(tmp_path: Path) -> None:
    """Aggregating the reference's rows reproduces its agent_metrics and key_metrics exactly."""
    entry = reference_entry()
    rows = rows_from_rollout_infos(entry)
    agent = entry["agent_ref"]["name"]
    plan = [planned(r["_ng_task_index"], r["_ng_rollout_index"], agent=agent) for r in rows]
    layout = write_run(tmp_path / "rollouts.jsonl", rows, plan=plan)
    await aggregate_shards([layout.output])
    (ours,) = read_metrics(layout)
    assert ours["agent_metrics"] == entry["agent_metrics"]
    assert list(ours["agent_metrics"]) == list(entry["agent_metrics"])
    assert ours["key_metrics"] == entry["key_metrics"]
    assert ours["_ng_environment_server"] == entry["_ng_environment_server"]
    theirs = [
        {k: v for k, v in t.items() if k not in _BOOKKEEPING} for t in entry["group_level_metrics"]
    ]
    mine = [
        {k: v for k, v in t.items() if k not in _BOOKKEEPING} for t in ours["group_level_metrics"]
    ]
    assert mine == theirs


_VALUES = st.one_of(
    st.integers(-1000, 1000),
    st.booleans(),
    st.floats(-1e6, 1e6, allow_nan=False, width=32),
    st.text(max_size=3),
    st.none(),
)


@st.composite
def verify_rows(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Draw rows as ``/aggregate_metrics`` receives them, sorted by (task, rollout)."""
    keys = draw(
        st.lists(
            st.tuples(st.integers(0, 5), st.integers(0, 4)), min_size=1, max_size=25, unique=True
        )
    )
    rows = []
    for task, rollout in sorted(keys):
        fields = {
            "reward": draw(st.one_of(st.integers(0, 1), st.floats(0, 1, width=32))),
            "score": draw(_VALUES),
            "ok": draw(st.booleans()),
            "_private": 5,
            "total_tokens": draw(_VALUES),
        }
        chosen = draw(st.lists(st.sampled_from(sorted(fields)), unique=True))
        usage = {
            "input_tokens": draw(st.integers(0, 900)),
            "total_tokens": draw(st.integers(0, 999)),
        }
        row: dict[str, Any] = {k: fields[k] for k in chosen}
        if draw(st.booleans()):
            row["response"] = {"usage": usage}
        if draw(st.integers(0, 5)) == 0:
            row["mask_sample"] = True
        row.update({"_ng_task_index": task, "_ng_rollout_index": rollout})
        rows.append(row)
    return rows


@given(verify_rows())
def test_local_default_metrics_equal_the_fake_deployment(rows: list[dict[str, Any]]) -> None:
    """On the same rows, local agent, key and per-task metrics equal the fake's reply."""
    group = GroupStats()
    for row in rows:
        group.add_row(
            row["_ng_task_index"],
            row["_ng_rollout_index"],
            metric_columns(row),
            masked=is_masked(row),
        )
    reply = fake_aggregate_metrics(rows)
    local = agent_metrics(group)
    assert local == reply["agent_metrics"]
    assert list(local) == list(reply["agent_metrics"])
    assert key_metrics(local) == reply["key_metrics"]
    theirs = [
        {k: v for k, v in t.items() if k not in _BOOKKEEPING} for t in reply["group_level_metrics"]
    ]
    mine = [
        {k: v for k, v in t.items() if k not in _BOOKKEEPING} for t in group_level_metrics(group)
    ]
    assert mine == theirs


def test_masked_rows_add_coverage_counts() -> None:
    """A masked row is left out of the statistics and counted under coverage/*."""
    group = GroupStats()
    group.add_row(0, 0, {"reward": 1.0}, masked=False)
    group.add_row(0, 1, {"reward": 0.0}, masked=True)
    group.add_row(1, 0, {"reward": 0.0}, masked=True)
    metrics = agent_metrics(group)
    assert metrics["mean/reward"] == 1.0
    assert metrics["coverage/masked_rollouts"] == 2
    assert metrics["coverage/fully_masked_tasks"] == 1
    assert metrics["num_repeats"] == 2
    assert key_metrics(metrics)["coverage/measured_rollouts"] == 1
