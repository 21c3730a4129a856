"""``trollout aggregate`` on NeMo Gym 0.7.0's own files writes the metrics NeMo Gym wrote.

Two checks, both through the command line: the reference metrics file's own rollouts (rebuilt
from its ``rollout_infos``) aggregate to the reference entry key by key; and the reference run
folder (rollouts, failures sidecar, materialized inputs) aggregates to the reference's
per-task entries for the tasks it holds (the same deterministic fake model produced both).

Deliberate differences, listed in docs/user-guide.md: NeMo Gym's ``sample`` (a payload copy
written by the server) and ``repeat_level_metrics`` are not written locally; trollout adds
``export_metrics`` and ``trollout``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from run_folders import planned, write_run
from test_default_metrics import REFERENCE, reference_entry, rows_from_rollout_infos

from builders import invoke

NOT_LOCAL = {"sample"}  # per task
NOT_LOCAL_ENTRY = {"repeat_level_metrics"}
OURS = {"export_metrics", "trollout"}


def aggregate(shard: Path) -> dict[str, Any]:
    """Run ``trollout aggregate SHARD`` and return the only entry of its metrics file."""
    result = invoke("aggregate", str(shard), "--no-report")
    assert result.exit_code == 0, result.output
    metrics = shard.with_name(shard.stem + "_aggregate_metrics.json")
    (entry,) = orjson.loads(metrics.read_bytes())
    return entry  # type: ignore[no-any-return]


def local(task: dict[str, Any]) -> dict[str, Any]:
    """Return a per-task entry without what is not computed locally."""
    return {k: v for k, v in task.items() if k not in NOT_LOCAL}


def test_reference_rollouts_aggregate_to_the_reference_entry_key_by_key(tmp_path: Path) -> None:
    """Every key NeMo Gym wrote, per entry and per task, has NeMo Gym's value."""
    entry = reference_entry()
    rows = rows_from_rollout_infos(entry)
    agent = entry["agent_ref"]["name"]
    plan = [planned(r["_ng_task_index"], r["_ng_rollout_index"], agent=agent) for r in rows]
    layout = write_run(tmp_path / "rollouts.jsonl", rows, plan=plan)
    ours = aggregate(layout.output)
    assert set(ours) - OURS == set(entry) - NOT_LOCAL_ENTRY
    for key in set(entry) - NOT_LOCAL_ENTRY - {"group_level_metrics"}:
        assert ours[key] == entry[key], key
    assert list(ours["agent_metrics"]) == list(entry["agent_metrics"])
    assert [local(t) for t in ours["group_level_metrics"]] == [
        local(t) for t in entry["group_level_metrics"]
    ]


def test_reference_run_folder_aggregates_to_the_reference_tasks(tmp_path: Path) -> None:
    """The real rollouts, sidecar and materialized inputs give NeMo Gym's per-task entries."""
    if not (REFERENCE / "rollouts.jsonl").is_file():
        pytest.skip(f"{REFERENCE} is absent")
    for name in ("rollouts", "rollouts_failures", "rollouts_materialized_inputs"):
        shutil.copy(REFERENCE / f"{name}.jsonl", tmp_path / f"{name}.jsonl")
    ours = aggregate(tmp_path / "rollouts.jsonl")
    entry = reference_entry()
    assert ours["agent_ref"] == {"name": "example_single_tool_call_simple_agent"}
    assert ours["_ng_environment_server"] == entry["_ng_environment_server"]
    assert ours["agent_metrics"]["num_repeats"] == entry["agent_metrics"]["num_repeats"]
    theirs = {t["_ng_task_index"]: local(t) for t in entry["group_level_metrics"]}
    mine = [local(t) for t in ours["group_level_metrics"]]
    assert [t["_ng_task_index"] for t in mine] == [0, 1, 2]
    assert mine == [theirs[t] for t in (0, 1, 2)]
    assert ours["export_metrics"]["coverage/failed/agent_run_error"] == 2
