"""Planning streams: memory follows distinct tasks, never rows (tracemalloc, two input sizes).

Each measurement plans (and may stream) a file of ``SMALL`` and of ``LARGE`` rows; what a row
costs is the growth between the two peaks divided by the rows added, so the fixed cost of the
first call (imports, caches, buffers) cancels out and the input stays small.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

from plan_router import direct_router

from trollout.collector.planning.plan import Plan, plan_rollouts
from trollout.settings import RunConfig

SMALL, LARGE = 300, 1200
PROMPT = "lorem ipsum dolor sit amet " * 8  # about 330 bytes a line
CONFIG = RunConfig(num_repeats=2, num_repeats_add_seed=True)


def write_rows(path: Path, rows: int, *, distinct: bool) -> None:
    """Write `rows` lines, all distinct or all identical."""
    with path.open("w", encoding="utf-8") as f:
        for i in range(rows):
            content = f"{i if distinct else 0}: {PROMPT}"
            row = {"responses_create_params": {"input": content}, "agent_ref": {"name": "alpha"}}
            f.write(json.dumps(row) + "\n")


def traced(path: Path, *, stream: bool) -> tuple[Plan, int]:
    """Plan (and maybe stream every row); return the plan and the traced peak in bytes."""
    tracemalloc.start()
    try:
        p = plan_rollouts(path, CONFIG, direct_router())
        if stream:
            assert sum(1 for _ in p.rows()) == p.expected
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return p, peak


def bytes_per_added_row(tmp_path: Path, *, distinct: bool, stream: bool) -> float:
    """Return how much the peak grows per input row from SMALL to LARGE rows."""
    peaks = {}
    for rows in (SMALL, SMALL, LARGE):  # the first call pays the one-off costs
        path = tmp_path / f"rows_{rows}.jsonl"
        write_rows(path, rows, distinct=distinct)
        p, peaks[rows] = traced(path, stream=stream)
        assert (p.tasks, p.expected) == (rows if distinct else 1, 2 * rows)
    return (peaks[LARGE] - peaks[SMALL]) / (LARGE - SMALL)


def test_plan_memory_follows_tasks_not_rows(tmp_path: Path) -> None:
    """Identical rows plan and stream in constant memory; distinct ones take ~150 B a task."""
    identical = bytes_per_added_row(tmp_path, distinct=False, stream=True)
    distinct = bytes_per_added_row(tmp_path, distinct=True, stream=False)
    print(
        f"\npeak traced memory per added row: identical {identical:.1f} B, "
        f"distinct {distinct:.1f} B"
    )
    assert identical < 8  # a row kept would cost its ~330-byte line, twice (two repeats)
    assert 16 < distinct < 250  # the measure sees a task's cost, and it stays small
