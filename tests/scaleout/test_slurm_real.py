"""The Slurm array script under a real Slurm: ``sbatch``, not bash with SLURM_* set.

A single-node cluster (Debian's slurm-wlm, `slurm_cluster`) runs the script ``trollout sbatch``
writes, as a user would submit it; the shards it leaves merge into the rollout set of one
machine. Job states come from ``scontrol``; every wait has a bound (a hang fails the test, it
never blocks the suite).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from slurm_cluster import SlurmCluster, SlurmUnavailableError, start_slurm

from builders import HANG_GUARD_S, invoke, read_jsonl, wait_for, write_jsonl
from trollout.collector.planning.task_selection import task_shard
from trollout.testing import FakeUrls, task_rows

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A single-node Slurm for this module (skipped, with the reason, when it cannot start)."""
    try:
        cluster = start_slurm(tmp_path_factory.mktemp("slurm"))
    except SlurmUnavailableError as exc:
        pytest.skip(str(exc))
    try:
        yield cluster
    finally:
        cluster.stop()


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


def outcome_keys(run: Path) -> tuple[set[tuple[int, int, float]], set[tuple[int, int, str]]]:
    """Return a run's landed (task, rollout, reward) and failed (task, rollout, class) sets."""
    landed = {(r["_ng_task_index"], r["_ng_rollout_index"], r["reward"]) for r in read_jsonl(run)}
    side = run.with_name(run.stem + "_failures.jsonl")
    failed = {
        (r["_ng_task_index"], r["_ng_rollout_index"], r["_ng_failure_class"])
        for r in (read_jsonl(side) if side.exists() else [])
    }
    return landed, failed


def hangs(fake: FakeUrls) -> int:
    """Return how many /run requests the fake has held (the 'hang' fault)."""
    stats = httpx.get(fake.head_url + "/_fake/stats", timeout=30).json()
    return int(stats["by_fault"].get("hang", 0))


def test_sbatch_submit_stopped_tasks_requeue_and_the_merge_job_equals_one_machine(
    tmp_path: Path, fake: FakeUrls, slurm: SlurmCluster
) -> None:
    """`sbatch --submit`: one task stopped by ``scancel -b --signal=TERM``, one by its 3-minute
    time limit (SIGTERM 120 s before); both requeue themselves and resume, a retryable failure
    is not re-sent, the merge job runs after the array, and the merged run equals one machine's.
    No task ends FAILED."""
    rows = list(task_rows(24, seed=7))
    shard_of = [task_shard(row, 4) for row in rows]
    cancelled = next(i for i, s in enumerate(shard_of) if s == 0)
    timed = next(i for i, s in enumerate(shard_of) if s == 1)
    failing = next(i for i, s in enumerate(shard_of) if s == 1 and i != timed)
    rows[failing]["fake_fault"] = {"kind": "status", "status": 500}
    plain = write_jsonl(tmp_path / "plain.jsonl", rows)  # the one-machine reference: no hangs
    for index in (cancelled, timed):
        rows[index] = {**rows[index], "fake_fault": {"kind": "hang", "attempts": [0]}}
    source = write_jsonl(tmp_path / "tasks.jsonl", rows)
    common = ["--head-server", fake.head_url, "--agent", "math_agent", "--num-repeats", "1",
              "--concurrency", "2", "--grace", "0"]  # fmt: skip
    reference = tmp_path / "one" / "eval.jsonl"
    one = invoke("collect", str(plain), "-o", str(reference), *common, "--no-aggregate")
    assert one.exit_code == 0, one.output
    out = tmp_path / "runs" / "eval.jsonl"
    script = tmp_path / "eval.sbatch"
    before = hangs(fake)
    made = invoke(
        "sbatch", "--shards", "4", "--time", "3", "--script", str(script), "--submit",
        str(source), "-o", str(out), *common, env=slurm.env,
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    array = int(made.output.split("submitted array job ")[1].split()[0])
    merge = int(made.output.split("submitted merge job ")[1].split()[0])
    wait_for(lambda: hangs(fake) >= before + 2, "both hanging rollouts")
    # Slurm may signal a 3-minute task up to a minute early (its event resolution), so the
    # time limit can reach task 0 before this does: either way it must stop and requeue.
    cancel = slurm.run("scancel", "-b", "--signal=TERM", f"{array}_0", check=False)
    seen = (cancel.returncode, cancel.stderr, slurm.run("squeue", "-h", "-o", "%i %T").stdout)
    tasks = slurm.wait_finished(array, 8 * 60)  # signal ~1 min, requeue delay 2 min
    logs = "".join(p.read_text() for p in sorted((out.parent / "eval_shards" / "logs").glob("*")))
    assert sorted(r["JobState"] for r in tasks) == ["COMPLETED"] * 4, logs
    restarts = {int(r["ArrayTaskId"]): int(r["Restarts"]) for r in tasks}
    assert restarts[0] >= 1, (restarts, seen, logs)  # requeued by Slurm
    assert restarts[1] >= 1, (restarts, logs)
    for index, count in restarts.items():  # each restart is the task's own clean stop (another
        # task still running when its early signal came may requeue too; never the whole array)
        assert logs.count(f"requeueing task {array}_{index} ") == count, (restarts, logs)
    (job,) = slurm.wait_finished(merge, HANG_GUARD_S)
    assert job["JobState"] == "COMPLETED", logs
    assert outcome_keys(out) == outcome_keys(reference)
    assert any(cls for _, _, cls in outcome_keys(out)[1])  # the 500 is in both, not re-sent
