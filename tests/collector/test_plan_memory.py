"""Planning streams: memory follows distinct tasks, never rows (tracemalloc, 100,000 rows)."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest
from plan_router import direct_router

from trollout.collector.plan import Plan, plan_rollouts
from trollout.config import RunConfig

ROWS = 100_000
PROMPT = "lorem ipsum dolor sit amet " * 8  # about 330 bytes a line


def write_rows(path: Path, *, distinct: bool) -> None:
    """Write ``ROWS`` lines, all distinct or all identical."""
    with path.open("w", encoding="utf-8") as f:
        for i in range(ROWS):
            content = f"{i if distinct else 0}: {PROMPT}"
            row = {"responses_create_params": {"input": content}, "agent_ref": {"name": "alpha"}}
            f.write(json.dumps(row) + "\n")


def traced(path: Path, config: RunConfig, *, stream: bool) -> tuple[Plan, int, int]:
    """Plan (and maybe stream every row); return the plan and both traced peaks in bytes."""
    tracemalloc.start()
    try:
        p = plan_rollouts(path, config, direct_router())
        planning = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        if stream:
            assert sum(1 for _ in p.rows()) == p.expected
        streaming = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return p, planning, streaming


@pytest.mark.slow
def test_plan_memory_follows_tasks_not_rows(tmp_path: Path) -> None:
    """100,000 identical rows plan and stream in under 1 MB; distinct ones take ~170 B a task."""
    path = tmp_path / "rows.jsonl"
    write_rows(path, distinct=False)
    config = RunConfig(num_repeats=2, num_repeats_add_seed=True)
    p, same_plan, same_stream = traced(path, config, stream=True)
    assert (p.tasks, p.expected) == (1, 2 * ROWS)
    write_rows(path, distinct=True)
    p, distinct_plan, _ = traced(path, config, stream=False)
    assert (p.tasks, p.expected) == (ROWS, 2 * ROWS)
    print(
        f"\n{ROWS} rows, peak traced memory: identical rows plan {same_plan / 1e6:.2f} MB, "
        f"stream {same_stream / 1e6:.2f} MB; distinct rows plan {distinct_plan / 1e6:.2f} MB"
    )
    assert max(same_plan, same_stream) < 1_000_000
    assert distinct_plan < 250 * ROWS
