"""Benchmark the rollout health check: rows per second and peak memory on reference-shaped rows.

The rows are NeMo Gym 0.7.0's own (tests/fixtures/health/obs_on_healthy: observability on,
~15 KB a row with two model calls' full request and response), renumbered into N tasks x 2
repeats, with every 10th row given a failed call so findings are rendered too. A fresh
subprocess runs `trollout.health.check_run` on the file and reports wall time, CPU time and
peak RSS (``resource.getrusage``), so the figure is the check's alone.

Usage: ``python bench/health.py [--rows 20000] [--workers 1] [--keep DIR]``. The goal in
issue 24 is at least 2,000 rows/s per core.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

FIXTURE = Path(__file__).parents[1] / "tests/fixtures/health/obs_on_healthy/rollouts.jsonl.gz"

_CHILD = """
import json, resource, sys, time
from trollout.health import check_run
path, workers = sys.argv[1], int(sys.argv[2])
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


def write_rows(path: Path, rows: int) -> int:
    """Write ``rows`` reference rows (renumbered) to ``path``; return its size in bytes."""
    base = [orjson.loads(line) for line in gzip.decompress(FIXTURE.read_bytes()).splitlines()]
    with open(path, "wb") as f:
        for i in range(rows):
            row = base[i % len(base)]
            task, rollout = divmod(i, 2)
            if i % 10 == 9:
                row = copy.deepcopy(row)
                meta = row["ng_trajectory"]["model_calls"][-1]["response_metadata"]
                meta["status_code"], meta["error_category"] = 500, "upstream_error"
            row["_ng_task_index"], row["_ng_rollout_index"] = task, rollout
            f.write(orjson.dumps(row) + b"\n")
    return path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="keep the files in this folder")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="trollout-bench-health-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        rollouts = folder / "rollouts.jsonl"
        size = write_rows(rollouts, args.rows)
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, str(rollouts), str(args.workers)],
            check=True,
            capture_output=True,
            text=True,
        )
        result = json.loads(out.stdout)
        rate = result["rows"] / result["wall_s"]
        per_core = result["rows"] / result["cpu_s"]
        print(
            f"health check: {result['rows']:,} rows ({size / 2**20:.0f} MiB), workers "
            f"{args.workers}: {result['wall_s']:.2f} s wall, {rate:,.0f} rows/s, "
            f"{per_core:,.0f} rows/s per CPU second, peak RSS {result['peak_rss_mib']:.0f} MiB; "
            f"verdicts {result['verdicts']}"
        )
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
