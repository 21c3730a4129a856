"""Slurm scenarios that run beside the suite, in `slurm_session`'s child process.

`requeue_scenario` is the issue's acceptance run: an array of 4 submitted by ``trollout sbatch
--submit``, one task stopped by ``scancel -b --signal=TERM``, one by its 3-minute ``--time``;
both must requeue themselves (Slurm counts a restart, no task ends FAILED), the merge job must
run after the array, and the merged run must equal the one-machine run. It returns what its
test (tests/scaleout/test_slurm_real.py) asserts on, and asserts nothing itself but that each
command it runs succeeded, so a failure is reported by that test, with the logs. What it returns
is JSON (it crosses from the child process as a file): sorted lists, never sets.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from slurm_session import cluster, scratch

from builders import HANG_GUARD_S, cli_command, read_jsonl, wait_for, write_jsonl
from trollout.collector.planning.task_selection import task_shard
from trollout.testing import AgentSpec, DeploymentSpec, Latency, spawn_fake_deployment, task_rows

REQUEUE = "test_sbatch_submit_stopped_tasks_requeue_and_the_merge_job_equals_one_machine"
HANG = {"kind": "hang", "attempts": [0]}  # the first try hangs until its task is stopped
FAIL = {"kind": "status", "status": 500}
SPEC = DeploymentSpec(
    agents=(AgentSpec(name="math_agent"),), latency=Latency(fixed_s=0.02), record_runs=False
)


def outcome_keys(run: Path) -> list[list[list[Any]]]:
    """Return a run's landed [task, rollout, reward] and failed [task, rollout, class], each
    sorted and without repeats."""
    landed = {(r["_ng_task_index"], r["_ng_rollout_index"], r["reward"]) for r in read_jsonl(run)}
    side = run.with_name(run.stem + "_failures.jsonl")
    failed = {
        (r["_ng_task_index"], r["_ng_rollout_index"], r["_ng_failure_class"])
        for r in (read_jsonl(side) if side.exists() else [])
    }
    return [[list(key) for key in sorted(landed)], [list(key) for key in sorted(failed)]]


def hangs(head_url: str) -> int:
    """Return how many /run requests the fake has held (the 'hang' fault)."""
    stats = httpx.get(head_url + "/_fake/stats", timeout=30).json()
    return int(stats["by_fault"].get("hang", 0))


def _cli(*args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        cli_command(*args), capture_output=True, text=True, env=env, timeout=HANG_GUARD_S
    )
    if done.returncode != 0:
        raise AssertionError(f"trollout {args[0]} exited {done.returncode}: {done.stderr}")
    return done.stdout + done.stderr


def requeue_scenario() -> dict[str, Any]:
    """Run the scenario (module docstring); return the jobs, restarts, logs and outcomes."""
    slurm = cluster()
    folder = scratch() / "requeue"
    folder.mkdir()
    rows = list(task_rows(24, seed=7))

    def first_in(shard: int, fault: dict[str, Any], *taken: int) -> int:
        # A task's shard is a hash of its row as written, fault included (`task_shard`).
        return next(
            i
            for i, row in enumerate(rows)
            if i not in taken and task_shard({**row, "fake_fault": fault}, 4) == shard
        )

    cancelled, timed = first_in(0, HANG), first_in(1, HANG)
    failing = first_in(1, FAIL, cancelled, timed)
    rows[failing]["fake_fault"] = FAIL
    plain = write_jsonl(folder / "plain.jsonl", rows)  # the one-machine reference: no hangs
    for index in (cancelled, timed):
        rows[index] = {**rows[index], "fake_fault": HANG}
    source = write_jsonl(folder / "tasks.jsonl", rows)
    placed = [task_shard(rows[i], 4) for i in (cancelled, timed, failing)]
    with spawn_fake_deployment(SPEC) as fake:
        common = ["--head-server", fake.head_url, "--agent", "math_agent", "--num-repeats", "1",
                  "--concurrency", "2", "--grace", "0"]  # fmt: skip
        reference = folder / "one" / "eval.jsonl"
        _cli("collect", str(plain), "-o", str(reference), *common, "--no-aggregate")
        out = folder / "runs" / "eval.jsonl"
        script = folder / "eval.sbatch"
        before = hangs(fake.head_url)
        made = _cli(
            "sbatch", "--shards", "4", "--time", "3", "--script", str(script), "--submit",
            str(source), "-o", str(out), *common, env=slurm.env,
        )  # fmt: skip
        array = int(made.split("submitted array job ")[1].split()[0])
        merge = int(made.split("submitted merge job ")[1].split()[0])
        wait_for(lambda: hangs(fake.head_url) >= before + 2, "both hanging rollouts")
        # Slurm may signal a 3-minute task up to a minute early (its event resolution), so the
        # time limit can reach task 0 before this does: either way it must stop and requeue.
        cancel = slurm.run("scancel", "-b", "--signal=TERM", f"{array}_0", check=False)
        seen = (cancel.returncode, cancel.stderr, slurm.run("squeue", "-h", "-o", "%i %T").stdout)
        tasks = slurm.wait_finished(array, 8 * 60)  # signal ~1 min, requeue delay 2 min
        (job,) = slurm.wait_finished(merge, HANG_GUARD_S)
    logs = "".join(p.read_text() for p in sorted((out.parent / "eval_shards" / "logs").glob("*")))
    return {
        "array": array,
        "tasks": tasks,
        "merge_job": job,
        "logs": logs,
        "seen": list(seen),
        "placed": placed,
        "merged": outcome_keys(out),
        "one_machine": outcome_keys(reference),
    }


SCENARIOS: dict[str, Callable[[], dict[str, Any]]] = {REQUEUE: requeue_scenario}
