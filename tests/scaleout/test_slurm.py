"""The Slurm array script run as Slurm would run it: bash, with the SLURM_* variables set.

Four jobs, one per shard, against the fake deployment; one job's shard holds a task whose first
attempt hangs, so that job is still running when the test sends it SIGTERM (what Slurm sends
before the time limit). It exits 143 leaving a resumable shard; the job run again finishes it,
and ``trollout aggregate`` merges the four shards into the complete run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from builders import HANG_GUARD_S, invoke, read_jsonl, wait_for, write_jsonl
from trollout.collector.planning.task_selection import task_shard
from trollout.testing import FakeUrls, task_rows

pytestmark = pytest.mark.slow


def start_job(script: Path, index: int, log: Path) -> subprocess.Popen[str]:
    """Start array job ``index`` of 4 as Slurm would (bash, SLURM_* set)."""
    env = {
        **os.environ,
        "SLURM_ARRAY_JOB_ID": "4242",
        "SLURM_ARRAY_TASK_ID": str(index),
        "SLURM_ARRAY_TASK_COUNT": "4",
        "SLURM_ARRAY_TASK_MIN": "0",
        "SLURM_ARRAY_TASK_MAX": "3",
    }
    with log.open("a") as sink:
        return subprocess.Popen(["bash", str(script)], env=env, stdout=sink, stderr=sink, text=True)


def hangs(fake: FakeUrls) -> int:
    """Return how many /run requests the fake has held (the 'hang' fault)."""
    stats = httpx.get(fake.head_url + "/_fake/stats", timeout=30).json()
    return int(stats["by_fault"].get("hang", 0))


def test_slurm_array_job_stopped_by_sigterm_resubmitted_and_aggregated(
    tmp_path: Path, fake: FakeUrls
) -> None:
    """SIGTERM leaves a resumable shard (143); resubmitted it finishes; the merge is complete."""
    rows = list(task_rows(40, seed=11))
    rows[5]["fake_fault"] = {"kind": "hang", "attempts": [0]}
    victim = task_shard(rows[5], 4)
    source = write_jsonl(tmp_path / "tasks.jsonl", rows)
    out = tmp_path / "runs" / "eval.jsonl"
    script = tmp_path / "eval.sbatch"
    made = invoke(
        "sbatch", "--shards", "4", "--time", "0:10:00", "--script", str(script),
        str(source), "-o", str(out), "--head-server", fake.head_url, "--agent", "math_agent",
        "--num-repeats", "2", "--concurrency", "2", "--grace", "0",
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    before = hangs(fake)
    logs = {i: tmp_path / f"slurm-4242_{i}.out" for i in range(4)}
    jobs = {i: start_job(script, i, logs[i]) for i in range(4)}
    try:
        for i, job in jobs.items():
            if i != victim:
                assert job.wait(timeout=HANG_GUARD_S) == 0, logs[i].read_text()
        wait_for(lambda: hangs(fake) > before, "the hanging rollout", proc=jobs[victim])
        jobs[victim].send_signal(signal.SIGTERM)  # Slurm: the time limit is near
        assert jobs[victim].wait(timeout=HANG_GUARD_S) == 143, logs[victim].read_text()
    finally:
        for job in jobs.values():
            if job.poll() is None:
                job.kill()
    assert "stopped by SIGTERM; resume to finish" in logs[victim].read_text()
    again = start_job(script, victim, logs[victim])
    assert again.wait(timeout=HANG_GUARD_S) == 0, logs[victim].read_text()
    shards = out.with_name("eval_shards")
    doc = json.loads(invoke("status", str(shards), "--json").output)
    assert doc["complete"]
    assert doc["shards"]["count"] == 4
    assert doc["landed"] == 80
    merged = invoke("aggregate", f"{shards}/*-of-00004/eval.jsonl", "-o", str(out), "--json")
    assert merged.exit_code == 0, merged.output
    report = json.loads(merged.output)
    assert report["coverage"]["expected"] == report["coverage"]["scored"] == 80
    keys = {(r["_ng_task_index"], r["_ng_rollout_index"]) for r in read_jsonl(out)}
    assert keys == {(t, r) for t in range(40) for r in range(2)}
