"""Slurm task start-up to first dispatch, under a real single-node Slurm.

    .venv/bin/python bench/slurm_startup.py [--repeats 3]

Starts the test suite's single-node Slurm (tests/scaleout/slurm_cluster.py: Debian's slurm-wlm
and munge, installed when absent, daemons on loopback stopped by pid) and the fake deployment in
its own process. Each repeat writes the array script with ``trollout sbatch --shards 1`` and
submits it with ``sbatch``; the first ``/run`` the fake receives ends the measure. Reported:

- ``submit -> first /run``: from just before ``sbatch`` to the fake's first ``/run`` (Slurm's
  scheduling, the job script's bash, Python's and trollout's start-up, planning, the run folder);
- ``collect started directly -> first /run``: the same command as a plain subprocess, which is
  the task's own start-up once Slurm has started it; the difference is Slurm's part;
- medians of the repeats. Polling is every 5 ms; the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "scaleout"), str(ROOT / "tests")]

from slurm_cluster import start_slurm  # noqa: E402

from trollout import jsonl  # noqa: E402
from trollout.testing import AgentSpec, DeploymentSpec, spawn_fake_deployment, task_rows  # noqa: E402

SPEC = DeploymentSpec(agents=(AgentSpec(name="math_agent"),), record_runs=False)
CLI = [sys.executable, "-m", "trollout.cli.main"]


def runs(head: str) -> int:
    """The /run requests the fake has answered or holds."""
    stats = httpx.get(head + "/_fake/stats", timeout=30).json()
    return int(stats["by_path"].get("/run", 0))


def first_run_after(head: str, before: int, started: float, limit_s: float = 120.0) -> float:
    """Seconds from `started` until the fake sees a /run beyond `before`."""
    while runs(head) <= before:
        if time.monotonic() - started > limit_s:
            raise SystemExit(f"no /run within {limit_s:g} s")
        time.sleep(0.005)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="trollout-bench-slurm-"))
    source = folder / "tasks.jsonl"
    source.write_bytes(b"".join(jsonl.dumps(r) for r in task_rows(8, seed=1)))
    slurm = start_slurm(folder / "cluster")
    try:
        with spawn_fake_deployment(SPEC) as fake:
            common = ["--head-server", fake.head_url, "--agent", "math_agent", "--no-aggregate"]
            direct, submitted = [], []
            for i in range(args.repeats):
                out = folder / f"direct{i}" / "eval.jsonl"
                before, started = runs(fake.head_url), time.monotonic()
                command = [*CLI, "collect", str(source), "-o", str(out), *common]
                quiet = subprocess.DEVNULL
                proc = subprocess.Popen(command, stdout=quiet, stderr=quiet)
                direct.append(first_run_after(fake.head_url, before, started))
                proc.wait(120)
                script = folder / f"job{i}.sbatch"
                out = folder / f"slurm{i}" / "eval.jsonl"
                subprocess.run([*CLI, "sbatch", "--shards", "1", "--script", str(script),
                                str(source), "-o", str(out), *common], check=True,
                               capture_output=True, env=slurm.env)  # fmt: skip
                before, started = runs(fake.head_url), time.monotonic()
                job = slurm.sbatch(script)
                submitted.append(first_run_after(fake.head_url, before, started))
                slurm.wait_finished(job, 120)
    finally:
        slurm.stop()
    print(f"Slurm task start-up to first dispatch, {args.repeats} repeats (medians):")
    print(f"  trollout collect started directly -> first /run: {statistics.median(direct):.2f} s")
    print(
        f"  sbatch submit -> first /run:                     {statistics.median(submitted):.2f} s"
    )
    print(f"  Slurm's own part (scheduling, job start):        "
          f"{statistics.median(submitted) - statistics.median(direct):.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
