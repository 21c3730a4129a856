"""`trollout status RUN`: where a run stands, from its files alone, human and --json."""

from __future__ import annotations

import json
import os
from pathlib import Path

from builders import invoke
from resume_folders import Folder, failure, landed, omitted
from trollout.recovery.lock import RunLock

KEYS = [(t, r) for t in range(4) for r in range(2)]


def sample(tmp_path: Path) -> Folder:
    """8 rollouts: 3 landed, 1 terminal, 1 at a cap of 2, 1 retryable, 1 interrupted, 1 never."""
    return (
        Folder(tmp_path, KEYS)
        .land(landed(0, 0), landed(0, 1), landed(1, 0))
        .fail(failure(1, 1, cls="skipped", terminal=True))
        .fail(failure(2, 0, 0), failure(2, 0, 1))
        .fail(failure(2, 1, cls="transient"), omitted(3, 0))
    )


def test_status_json_counts_every_rollout_once(tmp_path: Path) -> None:
    """--json reports each fate, failures by class, and whether retryable work remains."""
    folder = sample(tmp_path)
    result = invoke("status", str(folder.layout.output), "--json", "--max-attempts", "2")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["expected"] == 8
    fates = {k: doc[k] for k in ("landed", "terminal", "at_cap", "failed", "missing")}
    assert fates == {"landed": 3, "terminal": 1, "at_cap": 1, "failed": 1, "missing": 2}
    assert doc["counts_as_zero"] == 0
    assert doc["failures_by_class"] == {"agent_run_error": 1, "skipped": 1, "transient": 1}
    assert doc["to_dispatch"] == 3
    assert doc["retryable_remains"] is True
    assert doc["complete"] is False
    assert doc["max_attempts"] == 2
    assert doc["collector_pid"] is None


def test_status_json_exports_under_nemo_gym_names(tmp_path: Path) -> None:
    """--json carries NeMo Gym's exporter names: failures by class, retries, masking view."""
    folder = sample(tmp_path)
    result = invoke("status", str(folder.layout.output), "--json", "--max-attempts", "2")
    exports = json.loads(result.stdout)["export_metrics"]
    assert exports == {
        "coverage/failed/agent_run_error": 1,
        "coverage/failed/skipped": 1,
        "coverage/failed/transient": 1,
        "retries/attempts": 4,
        "retries/rollouts_retried": 1,
        "retries/at_cap": 0,  # each rollout is held to the cap it recorded (3)
        "retries/max_attempts": 3,
        "progress/agent/reward_unmasked": 100.0,
        "progress/agent/failed": 3,
        "progress/agent/omitted": 1,
    }


def test_status_cap_from_environment(tmp_path: Path) -> None:
    """With no manifest and no option, the cap is NEMO_GYM_MAX_ROLLOUT_ATTEMPTS."""
    folder = sample(tmp_path)
    env = {"NEMO_GYM_MAX_ROLLOUT_ATTEMPTS": "5"}
    doc = json.loads(invoke("status", str(folder.layout.output), "--json", env=env).stdout)
    assert (doc["max_attempts"], doc["at_cap"], doc["to_dispatch"]) == (5, 0, 4)


def test_status_human_output(tmp_path: Path) -> None:
    """The human view lists the counts and says what resume would do."""
    folder = sample(tmp_path)
    result = invoke("status", str(folder.layout.output.parent), "--max-attempts", "2")
    assert result.exit_code == 0, result.output
    for needle in ("expected            8", "landed              3", "skipped",
                   "trollout resume would dispatch 3"):  # fmt: skip
        assert needle in result.stdout


def test_status_names_a_running_collector(tmp_path: Path) -> None:
    """While a collector holds the lock, status still reads the files and names its pid."""
    folder = sample(tmp_path)
    with RunLock.for_layout(folder.layout):
        doc = json.loads(invoke("status", str(folder.layout.output), "--json").stdout)
    assert doc["collector_pid"] == os.getpid()


def test_status_without_inputs_exits_2(tmp_path: Path) -> None:
    """A run whose materialized inputs are gone: exit 2 with a message, no traceback."""
    folder = sample(tmp_path)
    folder.layout.materialized_inputs.unlink()
    result = invoke("status", str(folder.layout.output))
    assert result.exit_code == 2
    assert "materialized inputs" in result.stderr
    assert "Traceback" not in result.output


def test_status_of_a_sharded_run_with_no_shard_started_is_not_complete(tmp_path: Path) -> None:
    """An empty ``*_shards`` folder (an array job not started yet) is not a finished run: a
    pipeline polling ``complete`` must not move on to aggregation."""
    shards = tmp_path / "eval_shards"
    shards.mkdir()
    doc = json.loads(invoke("status", str(shards), "--json").stdout)
    assert doc["complete"] is False
    assert doc["shards"]["count"] == 0
    human = invoke("status", str(shards))
    assert human.exit_code == 0, human.output
    assert "no shard has started" in human.stdout
    assert "complete: every rollout landed" not in human.stdout
