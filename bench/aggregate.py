"""Benchmark ``trollout aggregate``: time and peak memory at 100k and 1M rollout rows.

For each case, a fresh subprocess writes 8 shards (rollouts with realistic-ish rows: a prompt,
an assistant message, usage, reward, latency; a failures sidecar; materialized inputs) into a
temporary folder, and another fresh subprocess runs the aggregation as the command does
(merge into ``-o``, metrics file, HTML report) and reports its wall time and peak RSS
(``resource.getrusage``). Cases:

- ``100k``: 100,000 rows, 25,000 tasks x 4 repeats;
- ``1M``: 1,000,000 rows, 250,000 tasks x 4 repeats (10x rows, 10x tasks);
- ``1M-fixed-tasks``: 1,000,000 rows, 25,000 tasks x 40 repeats (10x rows, same tasks).

About 3% of rollouts fail (sidecar rows; a third of them land on a retry) and 1% never ran.

Usage: ``python bench/aggregate.py [--cases 100k,1M,1M-fixed-tasks] [--keep DIR]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

import orjson

CASES = {
    "100k": (25_000, 4),
    "1M": (250_000, 4),
    "1M-fixed-tasks": (25_000, 40),
}
SHARDS = 8
AGENT = "math_agent"
ENV = "math_environment_server"
WORDS = ("the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on")


def text(rng: random.Random, n: int) -> str:
    """Return n random words."""
    return " ".join(rng.choice(WORDS) for _ in range(n))


def stamps(task: int, rollout: int) -> dict[str, object]:
    """Return the identity stamps of a rollout."""
    return {
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
        "agent_ref": {"name": AGENT},
        "_ng_environment_server": ENV,
    }


def landed_row(rng: random.Random, task: int, rollout: int, prompt: list[dict[str, str]]) -> bytes:
    """Return one success row as NeMo Gym 0.7.0 writes it, serialized."""
    inp, out = 300 + rng.randrange(200), 20 + rng.randrange(300)
    row = {
        "responses_create_params": {"input": prompt, "metadata": {"task_id": f"row-{task}"}},
        "response": {
            "id": f"resp_{task}_{rollout}_{rng.getrandbits(48):012x}",
            "model": "policy-model",
            "object": "response",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text(rng, out // 4)}],
                }
            ],
            "usage": {
                "input_tokens": inp,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": out,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": inp + out,
            },
        },
        "reward": float(rng.random() < 0.3 + (task % 5) * 0.1),
        "mask_sample": False,
        "failure_kind": None,
        "failure_reason": None,
        **stamps(task, rollout),
        "_ng_result_type": "legacy_agent",
        "elapsed_seconds": round(rng.lognormvariate(1.5, 0.6), 3),
    }
    return orjson.dumps(row) + b"\n"


def failure_row(task: int, rollout: int, attempt: int) -> bytes:
    """Return one failures-sidecar row."""
    row = {
        "_ng_failure_class": "agent_run_error",
        "_ng_failure_terminal": False,
        "_ng_failure_type": "HTTPStatusError",
        "_ng_failure_message": "500 Internal Server Error",
        "_ng_failure_http_status": 500,
        "_ng_failure_response_body": '"Hit an exception calling an inner server"',
        "_ng_failure_max_attempts": 3,
        "failure_kind": "http_500",
        **stamps(task, rollout),
        "_ng_attempt_index": attempt,
    }
    return orjson.dumps(row) + b"\n"


def generate(folder: Path, tasks: int, repeats: int, seed: int = 7) -> int:
    """Write the shards (task t goes to shard t % 8); return the number of landed rows."""
    rng = random.Random(seed)
    suffixes = ("", "_failures", "_materialized_inputs")
    landed = 0
    with contextlib.ExitStack() as stack:
        files = [
            [stack.enter_context(open(folder / f"shard{s}{x}.jsonl", "wb")) for x in suffixes]
            for s in range(SHARDS)
        ]
        for task in range(tasks):
            landed += _write_task(rng, task, repeats, *files[task % SHARDS])
    return landed


def _write_task(rng: random.Random, task: int, repeats: int, *files: IO[bytes]) -> int:
    """Write one task's rollouts: 1% never run, 3% failed (a third of those landed later)."""
    rollouts, failures, plan = files
    prompt = [{"role": "user", "content": text(rng, 40)}]
    landed = 0
    for rollout in range(repeats):
        body = {"responses_create_params": {"input": prompt}, **stamps(task, rollout)}
        plan.write(orjson.dumps(body) + b"\n")
        fate = rng.random()
        if fate < 0.01:
            continue
        if fate < 0.04:
            failures.write(failure_row(task, rollout, 0))
            if fate <= 0.03:
                continue
        rollouts.write(landed_row(rng, task, rollout, prompt))
        landed += 1
    return landed


CHILD = """
import json, resource, sys, time
from pathlib import Path
import trio
from trollout.metrics import aggregate_shards, resolve_inputs
folder = Path(sys.argv[1])
t0 = time.perf_counter()
shards = resolve_inputs(str(folder / "shard*.jsonl"))
result = trio.run(lambda: aggregate_shards(shards, output=folder / "merged" / "merged.jsonl"))
elapsed = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": elapsed, "peak_rss_mib": peak / 1024,
                  "covered": result.coverage.covered, "expected": result.coverage.expected}))
"""

BASELINE = """
import json, resource
import trio, trollout.metrics
print(json.dumps({"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run_child(code: str, *args: str) -> dict[str, float]:
    """Run Python code in a fresh interpreter and parse the JSON it prints."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def bench_case(name: str, root: Path) -> dict[str, object]:
    """Generate one case in a subprocess, aggregate it in another; return the figures."""
    tasks, repeats = CASES[name]
    folder = root / name
    folder.mkdir(parents=True)
    t0 = time.perf_counter()
    gen = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import aggregate as a; "
    gen += f"from pathlib import Path; print(a.generate(Path({str(folder)!r}), {tasks}, {repeats}))"
    landed = int(
        subprocess.run(
            [sys.executable, "-c", gen], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    generated = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in folder.glob("shard*.jsonl"))
    figures = run_child(CHILD, str(folder))
    return {
        "case": name,
        "rows": tasks * repeats,
        "tasks": tasks,
        "landed": landed,
        "input_mib": round(size / 2**20),
        "generate_s": round(generated, 1),
        "aggregate_s": round(figures["seconds"], 1),
        "rows_per_s": round(tasks * repeats / figures["seconds"]),
        "peak_rss_mib": round(figures["peak_rss_mib"]),
        "covered": f"{figures['covered']}/{figures['expected']}",
    }


def main() -> None:
    """Run the cases and print one line per case, then the growth."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--keep", type=Path, help="generate into DIR and keep it")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="trollout-bench-aggregate-"))
    baseline = run_child(BASELINE)["peak_rss_mib"]
    print(f"interpreter + imports: {baseline:.0f} MiB peak RSS")
    results = []
    try:
        for name in args.cases.split(","):
            row = bench_case(name, root)
            results.append(row)
            print(json.dumps(row), flush=True)
            if not args.keep:
                shutil.rmtree(root / name)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    by = {r["case"]: r for r in results}
    if "100k" in by:
        for name in ("1M", "1M-fixed-tasks"):
            if name in by:
                t = by[name]["aggregate_s"] / by["100k"]["aggregate_s"]  # type: ignore[operator]
                m = (by[name]["peak_rss_mib"] - baseline) / (by["100k"]["peak_rss_mib"] - baseline)  # type: ignore[operator]
                print(f"{name} vs 100k: time x{t:.1f}, memory above baseline x{m:.1f}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
