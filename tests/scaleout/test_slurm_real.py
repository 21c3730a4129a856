"""The Slurm array script under a real Slurm: ``sbatch``, not bash with SLURM_* set.

A single-node cluster (Debian's slurm-wlm, `slurm_cluster`) runs the script ``trollout sbatch``
writes, as a user would submit it; the shards it leaves merge into the rollout set of one
machine. Job states come from ``scontrol``; every wait has a bound (a hang fails the test, it
never blocks the suite).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from slurm_cluster import SlurmCluster, SlurmUnavailableError
from slurm_scenarios import REQUEUE, requeue_scenario
from slurm_session import cluster, started

from builders import HANG_GUARD_S, invoke, read_jsonl, write_jsonl
from trollout.testing import FakeUrls, task_rows

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slurm() -> SlurmCluster:
    """The session's single-node Slurm (skipped, with the reason, when it cannot start)."""
    try:
        return cluster()
    except SlurmUnavailableError as exc:
        pytest.skip(str(exc))


def test_sbatch_array_of_four_merges_into_the_one_machine_run(
    tmp_path: Path, fake: FakeUrls, slurm: SlurmCluster
) -> None:
    """Four array tasks under sbatch, each a shard; merged, every rollout once, none FAILED."""
    source = write_jsonl(tmp_path / "tasks.jsonl", list(task_rows(24, seed=5)))
    out = tmp_path / "runs" / "eval.jsonl"
    script = tmp_path / "eval.sbatch"
    made = invoke(
        "sbatch", "--shards", "4", "--time", "0:10:00", "--script", str(script),
        str(source), "-o", str(out), "--head-server", fake.head_url, "--agent", "math_agent",
        "--num-repeats", "2", "--concurrency", "2",
        "--sbatch-option", f"--output={tmp_path}/slurm-%A_%a.out",
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    job = slurm.sbatch(script)
    records = slurm.wait_finished(job, HANG_GUARD_S)
    logs = "".join(p.read_text() for p in sorted(tmp_path.glob("slurm-*.out")))
    assert sorted(r["JobState"] for r in records) == ["COMPLETED"] * 4, logs
    assert {r["ExitCode"] for r in records} == {"0:0"}
    shards = out.with_name("eval_shards")
    merged = invoke("aggregate", f"{shards}/*-of-00004/eval.jsonl", "-o", str(out), "--json")
    assert merged.exit_code == 0, merged.output
    report = json.loads(merged.output)
    assert report["coverage"]["expected"] == report["coverage"]["scored"] == 48
    keys = sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in read_jsonl(out))
    assert keys == [(t, r) for t in range(24) for r in range(2)]


def test_sbatch_submit_stopped_tasks_requeue_and_the_merge_job_equals_one_machine(
    slurm: SlurmCluster,
) -> None:
    """`sbatch --submit`: one task stopped by ``scancel -b --signal=TERM``, one by its 3-minute
    time limit (SIGTERM 120 s before); both requeue themselves and resume, a retryable failure
    is not re-sent, the merge job runs after the array, and the merged run equals one machine's.
    No task ends FAILED. The scenario (`slurm_scenarios.requeue_scenario`) started when
    collection ended and ran beside the suite; this waits for it and checks what it saw."""
    background = started(REQUEUE)
    found = background.result(10 * 60) if background is not None else requeue_scenario()
    array, tasks, logs = found["array"], found["tasks"], found["logs"]
    # The hanging rollouts are in tasks 0 (stopped by scancel) and 1 (by its time limit), the
    # failing one in task 1: a task with no hanging rollout may end before any signal.
    assert found["placed"] == [0, 1, 1]
    assert sorted(r["JobState"] for r in tasks) == ["COMPLETED"] * 4, logs
    restarts = {int(r["ArrayTaskId"]): int(r["Restarts"]) for r in tasks}
    assert restarts[0] >= 1, (restarts, found["seen"], logs)  # requeued by Slurm
    assert restarts[1] >= 1, (restarts, logs)
    for index, count in restarts.items():  # each restart is the task's own clean stop (another
        # task still running when its early signal came may requeue too; never the whole array)
        assert logs.count(f"requeueing task {array}_{index} ") == count, (restarts, logs)
    assert found["merge_job"]["JobState"] == "COMPLETED", logs
    assert found["merged"] == found["one_machine"]
    assert any(cls for _, _, cls in found["merged"][1])  # the 500 is in both, not re-sent
