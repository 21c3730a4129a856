"""A real `trollout collect` process ended by SIGINT, SIGTERM or --max-run-time, then resumed."""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from builders import HANG_GUARD_S, cli_command, count_lines, wait_for, write_tasks_input
from trollout import jsonl
from trollout.recovery.layout import RunLayout
from trollout.testing import (
    AgentSpec,
    DeploymentSpec,
    FakeUrls,
    Latency,
    spawn_fake_deployment,
)


@pytest.fixture(scope="module")
def slow_fake() -> Iterator[FakeUrls]:
    """A fake deployment in its own process whose /run takes 0.25 s."""
    spec = DeploymentSpec(
        agents=(AgentSpec(name="math_agent"),), latency=Latency(fixed_s=0.25), record_runs=False
    )
    with spawn_fake_deployment(spec) as urls:
        yield urls


def start_collect(
    tmp_path: Path, head: str, *extra: str, log: Path | None = None
) -> subprocess.Popen[str]:
    """Start `trollout collect` on 200 tasks at concurrency 10 (about 5 s of work).

    Its output goes to pipes, or to the file `log` when the test must read it while it runs.
    """
    source = tmp_path / "tasks.jsonl"
    if not source.exists():
        write_tasks_input(source, 200, seed=9)
    command = cli_command(
        "collect",
        str(source),
        "-o",
        str(tmp_path / "run" / "r.jsonl"),
        "--head-server",
        head,
        "--agent",
        "math_agent",
        "--concurrency",
        "10",
        "--progress",
        "plain",
        "--no-aggregate",
        *extra,
    )
    if log is None:
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with log.open("w") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, text=True)


def wait_for_landed(layout: RunLayout, count: int, proc: subprocess.Popen[str]) -> None:
    """Wait until the rollouts file holds `count` rows (the run is under way)."""
    wait_for(lambda: count_lines(layout.rollouts) >= count, f"{count} landed rows", proc=proc)


def check_consistent(layout: RunLayout) -> dict[str, object]:
    """Assert the folder is flushed and consistent; return its status."""
    status = json.loads(layout.batch_status.read_text())
    landed = list(jsonl.read_rows(layout.rollouts))
    keys = {(r["_ng_task_index"], r["_ng_rollout_index"]) for r in landed}
    assert len(keys) == len(landed) == status["completed"]
    assert status["closed"] is True
    counts = ("completed", "failed", "no_persist", "omitted", "not_started")
    assert sum(status[k] for k in counts) == status["expected"]
    assert layout.rollouts.read_bytes().endswith(b"\n")
    return status


def resume_to_completion(tmp_path: Path, head: str) -> None:
    """Resume the run and check every rollout landed exactly once.

    At 100 in flight: the rest lands in a wave or two rather than ~4 s at the run's 10 (the
    stop is what the run's pace is for; the resume only has to finish).
    """
    proc = start_collect(tmp_path, head, "--resume", "--concurrency", "100")
    _out, err = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode == 0, err
    layout = RunLayout.for_output(tmp_path / "run" / "r.jsonl")
    status = check_consistent(layout)
    assert status["completed"] == 200


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_stops_admission_flushes_and_resumes(
    tmp_path: Path, slow_fake: FakeUrls, signum: int, code: int
) -> None:
    """SIGINT/SIGTERM: in-flight rollouts finish within grace, exit 130/143, resume completes."""
    layout = RunLayout.for_output(tmp_path / "run" / "r.jsonl")
    proc = start_collect(tmp_path, slow_fake.head_url, "--grace", "600")
    wait_for_landed(layout, 20, proc)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode == code, err
    assert "starting no new rollout" in err
    assert "run timing report" in out + err
    status = check_consistent(layout)
    assert 20 <= status["completed"] < 200
    # The grace let every rollout in flight finish: none was interrupted. (A row a worker had
    # just taken when the signal came was never started: it is drained, and resume sends it.)
    kinds = Counter(r["kind"] for r in status["rollouts"] if r["state"] == "omitted")
    assert set(kinds) <= {"drained"}, kinds
    resume_to_completion(tmp_path, slow_fake.head_url)


def fake_stats(fake: FakeUrls) -> dict[str, Any]:
    """Return the fake deployment's counters."""
    stats: dict[str, Any] = httpx.get(fake.head_url + "/_fake/stats", timeout=30).json()
    return stats


@pytest.mark.slow
def test_second_sigint_cancels_at_once(tmp_path: Path, slow_fake: FakeUrls) -> None:
    """A second SIGINT cancels the rollouts in flight without waiting out the grace."""
    # Tasks 20-29 hang on their first attempt: once 20 landed, all 10 workers hold one, and
    # the 600 s grace would outlast the test's hang guard; only the second SIGINT ends them.
    hangs = {task: {"kind": "hang", "attempts": [0]} for task in range(20, 30)}
    write_tasks_input(tmp_path / "tasks.jsonl", 200, seed=9, faults=hangs)
    layout = RunLayout.for_output(tmp_path / "run" / "r.jsonl")
    log = tmp_path / "collect.log"
    proc = start_collect(tmp_path, slow_fake.head_url, "--grace", "600", log=log)
    wait_for_landed(layout, 20, proc)
    wait_for(lambda: fake_stats(slow_fake)["by_fault"].get("hang") == 10, "10 hung", proc=proc)
    proc.send_signal(signal.SIGINT)
    wait_for(lambda: "starting no new rollout" in log.read_text(), "the first stop", proc=proc)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=HANG_GUARD_S)
    assert proc.returncode == 130, log.read_text()
    assert "second SIGINT: cancelling the rollouts in flight" in log.read_text()
    status = check_consistent(layout)
    assert (status["completed"], status["omitted"]) == (20, 10)
    resume_to_completion(tmp_path, slow_fake.head_url)


@pytest.mark.slow
def test_max_run_time_exits_on_time_with_everything_recorded(
    tmp_path: Path, slow_fake: FakeUrls
) -> None:
    """--max-run-time 2 with grace 1: exit 1 after the grace, every finished rollout on disk."""
    layout = RunLayout.for_output(tmp_path / "run" / "r.jsonl")
    proc = start_collect(tmp_path, slow_fake.head_url, "--max-run-time", "2", "--grace", "1")
    _out, err = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode == 1, err
    assert "--max-run-time reached" in err
    status = check_consistent(layout)
    assert 0 < status["completed"] < 200
    resume_to_completion(tmp_path, slow_fake.head_url)
