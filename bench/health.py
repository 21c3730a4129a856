"""Benchmark the rollout health check: rows per second and peak memory on reference-shaped rows.

The rows are NeMo Gym 0.7.0's own (tests/fixtures/health/obs_on_healthy: observability on,
~15 KB a row with two model calls' full request and response), renumbered into N tasks x 2
repeats, with every 10th row given a failed call so findings are rendered too. A fresh
subprocess runs `trollout.health.check_run` on the file and reports wall time, CPU time and
peak RSS (``resource.getrusage``), so the figure is the check's alone.

Usage: ``python bench/health.py [--rows 20000 100000] [--tasks 50] [--workers 1]
[--baseline main] [--keep DIR]``. ``--baseline REF`` also runs REF's health package (``git show
REF:...`` into a temporary package, its relative imports of the rest of trollout pointed at the
installed one) on the same file, one after the other, and prints both lines. The goal in issue
24 is at least 2,000 rows/s per core.

Figures (2 busy shared cores, workers 1; ``--baseline main`` = the health check before the
external sort, run on the same file right before this tree's; one run each):

    python bench/health.py --rows 20000 100000 --tasks 50 --baseline main
    rows     main: rows/s  peak RSS   this tree: rows/s  peak RSS
    20,000       6,048      56 MiB               6,341     44 MiB
    100,000      5,827     112 MiB               5,339     44 MiB

    python bench/health.py --rows 20000 100000 --baseline main   (two repeats a task)
    20,000       6,307      71 MiB               6,504     59 MiB
    100,000      6,297     195 MiB               6,258    124 MiB

With a fixed number of tasks the peak no longer grows with rows; with two repeats a task what
remains is per task (its name and its line of the summary's ``tasks``, which is written whole).
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

FIXTURE = Path(__file__).parents[1] / "tests/fixtures/health/obs_on_healthy/rollouts.jsonl.gz"

_CHILD = """
import importlib, json, resource, sys, time
path, workers, package = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if len(sys.argv) > 4:
    sys.path.insert(0, sys.argv[4])
check_run = importlib.import_module(package).check_run
wall, cpu = time.perf_counter(), time.process_time()
report = check_run(path, workers=workers)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
children = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({
    "rows": report.checked, "verdicts": report.verdicts, "wall_s": wall,
    "cpu_s": cpu + children.ru_utime + children.ru_stime,
    "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"""


def write_rows(path: Path, rows: int, tasks: int | None = None) -> int:
    """Write ``rows`` reference rows (renumbered) to ``path``; return its size in bytes.

    ``tasks``: that many tasks, each repeated rows/tasks times (default: two repeats a task).
    """
    base = [orjson.loads(line) for line in gzip.decompress(FIXTURE.read_bytes()).splitlines()]
    with open(path, "wb") as f:
        for i in range(rows):
            row = base[i % len(base)]
            task, rollout = divmod(i, 2) if tasks is None else (i % tasks, i // tasks)
            if i % 10 == 9:
                row = copy.deepcopy(row)
                meta = row["ng_trajectory"]["model_calls"][-1]["response_metadata"]
                meta["status_code"], meta["error_category"] = 500, "upstream_error"
            row["_ng_task_index"], row["_ng_rollout_index"] = task, rollout
            f.write(orjson.dumps(row) + b"\n")
    return path.stat().st_size


def baseline(ref: str, folder: Path) -> Path:
    """Write ``ref``'s health package as ``trollout_health_baseline`` under ``folder``."""
    root = Path(__file__).parents[1]
    package = folder / "baseline" / "trollout_health_baseline"
    package.mkdir(parents=True)
    names = subprocess.run(
        ["git", "ls-tree", "--name-only", f"{ref}:src/trollout/health/"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for name in names:
        text = subprocess.run(
            ["git", "show", f"{ref}:src/trollout/health/{name}"],
            cwd=root,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        (package / name).write_text(re.sub(r"from \.\.(\w)", r"from trollout.\1", text))
    return package.parent


def measure(rollouts: Path, workers: int, package: str, path: Path | None) -> dict[str, Any]:
    """Run one health check in a fresh interpreter; return its figures."""
    extra = [str(path)] if path is not None else []
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(rollouts), str(workers), package, *extra],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[20_000])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--tasks", type=int, help="that many tasks (default: rows / 2)")
    parser.add_argument("--baseline", metavar="REF", help="also run REF's health package")
    parser.add_argument("--keep", type=Path, help="keep the files in this folder")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="trollout-bench-health-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        runs: list[tuple[str, str, Path | None]] = [("this tree", "trollout.health", None)]
        if args.baseline:
            runs.insert(
                0, (args.baseline, "trollout_health_baseline", baseline(args.baseline, folder))
            )
        for rows in args.rows:
            rollouts = folder / "rollouts.jsonl"
            size = write_rows(rollouts, rows, args.tasks)
            for label, package, path in runs:
                result = measure(rollouts, args.workers, package, path)
                rate = result["rows"] / result["wall_s"]
                per_core = result["rows"] / result["cpu_s"]
                print(
                    f"health check ({label}): {result['rows']:,} rows ({size / 2**20:.0f} MiB), "
                    f"workers {args.workers}: {result['wall_s']:.2f} s wall, {rate:,.0f} rows/s, "
                    f"{per_core:,.0f} rows/s per CPU second, peak RSS "
                    f"{result['peak_rss_mib']:.0f} MiB; verdicts {result['verdicts']}",
                    flush=True,
                )
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
