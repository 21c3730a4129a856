"""The health check's memory follows tasks, not rows; its spool leaves nothing behind.

Memory is counted, not timed: `tracemalloc` reports the peak of Python allocations during one
`check_run`, which for the same code and the same input is the same number on a busy machine.
"""

from __future__ import annotations

import gzip
import os
import random
import tracemalloc
from pathlib import Path

import orjson
import pytest

from trollout.health import check_run
from trollout.health import spool as spool_module

FIXTURES = Path(__file__).parents[1] / "fixtures" / "health"
TASKS = 50


def _write_rows(path: Path, rows: int) -> None:
    """``rows`` small rows of the same 50 tasks: more rows are more repeats of each task.

    Most rows have no trajectory (unobserved, nine checks named on the line); every 10th holds
    an unreadable trajectory (a rendered finding); every 25th is written twice (a duplicate,
    settled at the end).
    """
    with open(path, "wb") as f:
        for i in range(rows):
            task, rollout = i % TASKS, i // TASKS
            row: dict[str, object] = {
                "_ng_task_index": task,
                "_ng_rollout_index": rollout,
                "response": {"usage": {"input_tokens": 7, "output_tokens": 3}},
            }
            if i % 10 == 3:
                row["ng_trajectory"] = {"schema": "not a trajectory"}
            f.write(orjson.dumps(row) + b"\n")
            if i % 25 == 7:
                f.write(orjson.dumps(row) + b"\n")


def _peak(rollouts: Path, out: Path) -> int:
    """Peak bytes Python allocated during one `check_run` (tracemalloc)."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        check_run(rollouts, out)
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_memory_follows_tasks_not_rows(tmp_path: Path) -> None:
    """2,000 and 20,000 rows of the same 50 tasks peak within 2 MiB of each other."""
    peaks = {}
    for rows in (200, 2_000, 20_000):  # the first warms imports and caches
        folder = tmp_path / str(rows)
        folder.mkdir()
        _write_rows(folder / "rollouts.jsonl", rows)
        peaks[rows] = _peak(folder / "rollouts.jsonl", folder)
    report = check_run(tmp_path / "20000" / "rollouts.jsonl", tmp_path / "20000")
    assert report.checked == 20_800  # every row was checked
    assert len(report.summary["tasks"]) == TASKS
    assert report.issues["rollout_duplicate_identity"] == 1_600
    assert peaks[20_000] - peaks[2_000] < 2 * 2**20, peaks


@pytest.mark.parametrize(("run_rows", "block_rows"), [(1, 1), (3, 2), (7, 16)])
def test_spilled_runs_write_the_same_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_rows: int, block_rows: int
) -> None:
    """Sorting through runs on disk gives the bytes of sorting in memory (shuffled duplicates)."""
    rows = gzip.decompress((FIXTURES / "edited_unhealthy" / "rollouts.jsonl.gz").read_bytes())
    lines = rows.splitlines() * 3
    random.Random(24).shuffle(lines)
    data = b"\n".join(lines) + b"\n"
    files = {}
    for name, size in (("memory", None), ("spilled", (run_rows, block_rows))):
        if size is not None:
            monkeypatch.setattr(spool_module, "RUN_ROWS", size[0])
            monkeypatch.setattr(spool_module, "BLOCK_ROWS", size[1])
        folder = tmp_path / name
        folder.mkdir()
        (folder / "rollouts.jsonl").write_bytes(data)
        check_run(folder / "rollouts.jsonl", folder)
        files[name] = [
            (folder / f).read_bytes().replace(str(folder).encode(), b"X")
            for f in ("rollout_verdicts.jsonl", "quality_summary.json")
        ]
        assert sorted(os.listdir(folder)) == [
            "quality_summary.json",
            "rollout_verdicts.jsonl",
            "rollouts.jsonl",
        ]
    assert files["memory"] == files["spilled"]


def test_a_failed_write_leaves_no_spool_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spool is removed when writing the verdicts fails half way (nothing else written)."""
    monkeypatch.setattr(spool_module, "RUN_ROWS", 4)
    _write_rows(tmp_path / "rollouts.jsonl", 100)
    (tmp_path / "rollout_verdicts.jsonl").mkdir()  # the verdicts cannot be renamed into place
    with pytest.raises(IsADirectoryError):
        check_run(tmp_path / "rollouts.jsonl", tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["rollout_verdicts.jsonl", "rollouts.jsonl"]
    assert os.listdir(tmp_path / "rollout_verdicts.jsonl") == []
