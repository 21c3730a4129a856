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

import pytest
from slurm_cluster import SlurmCluster, SlurmUnavailableError, start_slurm

from builders import HANG_GUARD_S, invoke, read_jsonl, write_jsonl
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
