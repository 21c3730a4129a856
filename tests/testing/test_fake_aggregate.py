"""The fake's default /aggregate_metrics against NeMo Gym 0.7.0's own output."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from trollout.testing import aggregate_metrics

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference" / "nemo_gym_0.7.0"


def _reference() -> dict[str, Any]:
    path = REFERENCE / "rollouts_aggregate_metrics.json"
    if not path.exists():
        pytest.skip("the NeMo Gym reference files are not beside this clone")
    (entry,) = json.loads(path.read_text())
    assert isinstance(entry, dict)
    return entry


def _verify_rows(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """Rebuild the rows NeMo Gym sent (stripped as its collector strips them)."""
    rows = []
    for group in entry["group_level_metrics"]:
        for info in group["rollout_infos"]:
            usage = {
                "input_tokens": info["input_tokens"],
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": info["output_tokens"],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": info["total_tokens"],
            }
            rows.append(
                {
                    "reward": info["reward"],
                    "mask_sample": False,
                    "failure_kind": None,
                    "failure_reason": None,
                    "_ng_task_index": info["_ng_task_index"],
                    "_ng_rollout_index": info["_ng_rollout_index"],
                    "agent_ref": entry["agent_ref"],
                    "_ng_environment_server": entry["_ng_environment_server"],
                    "_ng_result_type": "legacy_agent",
                    "response": {"usage": usage},
                }
            )
    return rows


def _assert_same(actual: Any, expected: Any) -> None:
    """Compare JSON values: same keys in the same order, floats to 1e-12."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict)
        assert list(actual) == list(expected)
        for key in expected:
            _assert_same(actual[key], expected[key])
    elif isinstance(expected, list):
        assert isinstance(actual, list)
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            _assert_same(a, e)
    elif isinstance(expected, float):
        assert actual == pytest.approx(expected, rel=1e-12, abs=1e-12)
    else:
        assert actual == expected


def test_aggregate_matches_the_reference_agent_metrics() -> None:
    """agent_metrics and key_metrics equal NeMo Gym 0.7.0's, key order included."""
    entry = _reference()
    result = aggregate_metrics(_verify_rows(entry))
    _assert_same(result["agent_metrics"], entry["agent_metrics"])
    _assert_same(result["key_metrics"], entry["key_metrics"])


def test_aggregate_matches_the_reference_group_metrics() -> None:
    """group_level_metrics equal NeMo Gym 0.7.0's, bookkeeping keys included."""
    entry = _reference()
    result = aggregate_metrics(_verify_rows(entry))
    _assert_same(result["group_level_metrics"], entry["group_level_metrics"])
    assert result["repeat_level_metrics"] == entry["repeat_level_metrics"] == []


def test_aggregate_std_is_the_sample_std() -> None:
    """std/ uses n - 1, as the reference's 4.442 for its input tokens shows."""
    entry = _reference()
    tokens = [i["input_tokens"] for g in entry["group_level_metrics"] for i in g["rollout_infos"]]
    assert entry["agent_metrics"]["std/input_tokens"] == pytest.approx(statistics.stdev(tokens))
    assert entry["agent_metrics"]["std/input_tokens"] != pytest.approx(statistics.pstdev(tokens))


def _row(task: int, rollout: int, **fields: Any) -> dict[str, Any]:
    return {"_ng_task_index": task, "_ng_rollout_index": rollout, **fields}


def test_aggregate_counts_booleans_and_skips_private_keys() -> None:
    """Booleans count as 0/1; keys starting with _ and non-numbers are not metrics."""
    rows = [
        _row(0, 0, reward=1.0, terminated=True, _ng_x=5, note="a"),
        _row(0, 1, reward=0.0, terminated=False),
    ]
    agent = aggregate_metrics(rows)["agent_metrics"]
    assert agent["mean/terminated"] == 0.5
    assert not any("_ng_x" in k or "note" in k for k in agent)


def test_aggregate_usage_wins_over_a_top_level_number() -> None:
    """A usage count replaces a top-level number of the same name."""
    rows = [_row(0, 0, reward=1.0, output_tokens=999, response={"usage": {"output_tokens": 7}})]
    assert aggregate_metrics(rows)["agent_metrics"]["mean/output_tokens"] == 7.0


def test_aggregate_single_values_get_zero_std() -> None:
    """When no std can be computed, present columns get 0.0."""
    groups = aggregate_metrics([_row(0, 0, reward=1.0), _row(1, 0, reward=0.0)])[
        "group_level_metrics"
    ]
    assert [g["std/reward"] for g in groups] == [0.0, 0.0]


def test_aggregate_drops_a_std_that_cannot_be_computed() -> None:
    """A column with one value in a group with other stds gets no std."""
    rows = [_row(0, 0, reward=1.0, extra=3), _row(0, 1, reward=0.0)]
    agent = aggregate_metrics(rows)["agent_metrics"]
    assert agent["mean/extra"] == 3.0
    assert "std/extra" not in agent
    assert agent["std/reward"] == pytest.approx(statistics.stdev([1.0, 0.0]))


def test_aggregate_leaves_masked_rows_out_and_reports_coverage() -> None:
    """Masked samples do not enter the statistics; coverage keys say so."""
    rows = [
        _row(0, 0, reward=1.0),
        _row(0, 1, reward=0.0, mask_sample=True),
        _row(1, 0, reward=0.0, mask_sample=True),
    ]
    result = aggregate_metrics(rows)
    coverage = {
        "coverage/measured_rollouts": 1,
        "coverage/masked_rollouts": 2,
        "coverage/measured_tasks": 1,
        "coverage/fully_masked_tasks": 1,
    }
    assert result["key_metrics"] == {"mean/reward": 1.0} | coverage
    assert result["agent_metrics"]["num_repeats"] == 2
    assert [g["_ng_task_index"] for g in result["group_level_metrics"]] == [0]
    assert "mean/mask_sample" not in result["agent_metrics"]


def test_aggregate_all_masked_reports_coverage_only() -> None:
    """With every row masked there are no means, only coverage."""
    result = aggregate_metrics([_row(0, 0, reward=0.0, mask_sample=True)])
    assert result["agent_metrics"] == result["key_metrics"]
    assert result["agent_metrics"]["coverage/masked_rollouts"] == 1
    assert result["group_level_metrics"] == []


def test_aggregate_of_nothing_is_empty() -> None:
    """No rows give NeMo Gym's empty AggregateMetrics."""
    assert aggregate_metrics([]) == {
        "group_level_metrics": [],
        "agent_metrics": {},
        "key_metrics": {},
        "perf_summary": None,
        "repeat_level_metrics": [],
    }


def test_aggregate_refuses_duplicate_rollout_keys() -> None:
    """Two rows of one (task, rollout) are an error, as in NeMo Gym."""
    with pytest.raises(ValueError, match="Duplicate"):
        aggregate_metrics([_row(0, 0, reward=1.0), _row(0, 0, reward=0.0)])
