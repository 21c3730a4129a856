"""Plans larger than a sane bound are refused before anything is written."""

from __future__ import annotations

import shutil
from collections import namedtuple
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from trollout import jsonl
from trollout.testing import task_rows

Usage = namedtuple("Usage", "total used free")


def invoke(*args: str) -> Result:
    """Run the trollout CLI with args."""
    from trollout.cli.main import cli

    return CliRunner().invoke(cli, list(args))


def collect(tmp_path: Path, *extra: str) -> Result:
    """Collect 40 example rows into tmp_path/run against an agent that is never reached."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(jsonl.dumps(r) for r in task_rows(40, seed=1)))
    return invoke("collect", str(source), "-o", str(tmp_path / "run" / "r.jsonl"),
                  "--agent-url", "math_agent=http://127.0.0.1:9", "--agent", "math_agent",
                  "--progress", "plain", *extra)  # fmt: skip


def refused(result: Result, *needles: str) -> None:
    """Exit 2, one line naming every needle, no traceback."""
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_collect_refuses_a_billion_repeats_naming_the_bound(tmp_path: Path) -> None:
    """--num-repeats 1000000000 over 40 rows: refused at planning, nothing written."""
    refused(collect(tmp_path, "--num-repeats", "1000000000"), "40,000,000,000", "--max-rollouts")
    assert not (tmp_path / "run").exists()


def test_collect_max_rollouts_allows_a_larger_plan_and_bounds_a_small_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bound is an option: lower it to refuse 80 rollouts; raising it lets them plan."""
    refused(collect(tmp_path, "--num-repeats", "2", "--max-rollouts", "79"), "max_rollouts=79")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**6, 0, 1000))
    result = collect(tmp_path, "--num-repeats", "2", "--max-rollouts", "80")
    refused(result, "80 rollouts need about", "1.0 kB free")  # planned, then the disk check


def test_collect_refuses_a_plan_larger_than_the_free_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Materialized inputs that cannot fit on the output's disk are refused up front."""
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - 5000, 5000))
    refused(collect(tmp_path, "--num-repeats", "4"), "160 rollouts", "5.0 kB free")
    assert not (tmp_path / "run").exists()
