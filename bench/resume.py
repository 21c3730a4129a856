"""Measure resume's decision: what to dispatch for a generated run folder of N rollouts.

For each size (default 100,000 and 1,000,000 rollouts) a run folder is generated under
``--dir``: materialized inputs (N rows, 4 repeats per task), a rollouts file with half of the
rollouts landed, a sidecar with a quarter failed (a third of them on their second attempt, a
tenth terminal), and the attempt ledger of everything dispatched (512 reservations per line).
Then, in a fresh child process per size (so peak RSS belongs to one decision alone),
`recovery.resume.scan_run` decides what to dispatch, and the rows to dispatch are streamed back
from the inputs file as the engine's feeder would. Printed per size: the decision's wall time,
the time to stream the rows, peak RSS and its growth over the process's baseline (imports), and
how both grow from the first size to the last.

    .venv/bin/python bench/resume.py [--sizes 100000,1000000] [--dir /tmp] [--longest-first]

The generated folders are removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory import peak_rss_mib

REPEATS = 4
LEDGER_BATCH = 512


def generate(folder: Path, rollouts: int) -> Path:
    """Write a run folder of ``rollouts`` materialized rollouts; return its output path."""
    out = folder / "r.jsonl"
    ledger: list[list[int]] = []
    with open(folder / "r_materialized_inputs.jsonl", "wb") as inputs, open(out, "wb") as landed, \
            open(folder / "r_failures.jsonl", "wb") as failures, \
            open(folder / "r_attempts.jsonl", "wb") as attempts:  # fmt: skip
        for i in range(rollouts):
            task, rollout = divmod(i, REPEATS)
            stamps = {"_ng_task_index": task, "_ng_rollout_index": rollout,
                      "agent_ref": {"name": "math_agent"}}  # fmt: skip
            prompt = {"input": [{"role": "user", "content": f"What is {task} + {rollout * 7}?"}]}
            inputs.write(_line({"responses_create_params": prompt, "expected_answer": str(task),
                                **stamps}))  # fmt: skip
            kind = i % 4
            if kind in (0, 1):  # half landed
                landed.write(_line({"responses_create_params": prompt, "reward": 1.0,
                                    "response": {"output_text": str(task), "usage": {"n": 9}},
                                    **stamps, "elapsed_seconds": 1.5}))  # fmt: skip
                ledger.append([task, rollout, 0])
            elif kind == 2:  # a quarter failed
                for attempt in range(2 if i % 3 == 0 else 1):
                    failures.write(_line(_failure(stamps, attempt, terminal=i % 10 == 2)))
                    ledger.append([task, rollout, attempt])
            else:  # a quarter never started (or killed in flight: reserved, no row)
                if i % 8 == 3:
                    ledger.append([task, rollout, 0])
            if len(ledger) >= LEDGER_BATCH:
                attempts.write(_line({"attempts": ledger}))
                ledger = []
        if ledger:
            attempts.write(_line({"attempts": ledger}))
    return out


def _failure(stamps: dict[str, object], attempt: int, *, terminal: bool) -> dict[str, object]:
    row = {"_ng_failure_class": "skipped" if terminal else "agent_run_error",
           "_ng_failure_terminal": terminal, "_ng_failure_type": "HTTPStatusError",
           "_ng_failure_message": "HTTP 500 Internal Server Error", "_ng_failure_http_status": 500,
           "_ng_failure_response_body": '"Hit an exception"', "_ng_failure_max_attempts": 3,
           "_ng_failure_delivery": "delivered", "failure_kind": "http_500", **stamps,
           "elapsed_seconds": 2.5 + attempt}  # fmt: skip
    if attempt:
        row["_ng_attempt_index"] = attempt
    return row


def _line(row: dict[str, object]) -> bytes:
    return orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE)


def measure(output: str, longest_first: bool) -> dict[str, float]:
    """Decide and stream the rows to dispatch (runs in the child); return the figures."""
    from trollout.recovery.layout import RunLayout
    from trollout.recovery.resume import ResumeRules, scan_run

    baseline = peak_rss_mib()
    start = time.perf_counter()
    plan = scan_run(RunLayout.for_output(output), ResumeRules(longest_first=longest_first))
    decided = time.perf_counter() - start
    streamed = sum(1 for _ in plan.rows())
    stream_s = time.perf_counter() - start - decided
    peak = peak_rss_mib()
    return {"decide_s": decided, "stream_s": stream_s, "to_dispatch": plan.tally.to_dispatch,
            "streamed": streamed, "peak_mb": peak, "growth_mb": peak - baseline,
            "landed": plan.tally.fates["landed"]}  # fmt: skip


def run_size(root: Path, rollouts: int, longest_first: bool) -> dict[str, float]:
    """Generate a folder of ``rollouts`` and measure the decision in a child process."""
    with tempfile.TemporaryDirectory(dir=root, prefix="trollout-resume-") as tmp:
        start = time.perf_counter()
        out = generate(Path(tmp), rollouts)
        made = time.perf_counter() - start
        size_mb = sum(p.stat().st_size for p in Path(tmp).iterdir()) / 2**20
        child = subprocess.run(
            [sys.executable, __file__, "--child", str(out)]
            + (["--longest-first"] if longest_first else []),
            capture_output=True, check=True, text=True,
        )  # fmt: skip
    figures: dict[str, float] = json.loads(child.stdout)
    figures.update(rollouts=rollouts, generate_s=made, folder_mb=size_mb)
    return figures


def main() -> None:
    """Parse arguments, run every size, print the table and the growth."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--longest-first", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.longest_first)))
        return
    rows = [run_size(Path(args.dir), int(n), args.longest_first) for n in args.sizes.split(",")]
    print(f"{'rollouts':>10} {'folder MB':>10} {'decide s':>9} {'stream s':>9} "
          f"{'to send':>9} {'peak MB':>8} {'growth MB':>10}")  # fmt: skip
    for r in rows:
        print(f"{r['rollouts']:>10,} {r['folder_mb']:>10.0f} {r['decide_s']:>9.2f} "
              f"{r['stream_s']:>9.2f} {r['to_dispatch']:>9,} {r['peak_mb']:>8.0f} "
              f"{r['growth_mb']:>10.1f}")  # fmt: skip
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        scale = last["rollouts"] / first["rollouts"]
        print(
            f"x{scale:.0f} rollouts: decide time x{last['decide_s'] / first['decide_s']:.1f}, "
            f"RSS growth x{last['growth_mb'] / max(first['growth_mb'], 0.1):.1f}"
        )


if __name__ == "__main__":
    main()
