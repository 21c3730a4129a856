"""Crash consistency: a real `trollout collect` process SIGKILLed at random moments, resumed.

The fake deployment runs in its own process (so killing the collector leaves it serving and
its log of every ``/run`` received survives); the collector is ``python -m trollout.cli.main``.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import httpx
import orjson
import pytest

from builders import HANG_GUARD_S, cli_command, count_lines, wait_for, write_tasks_input
from trollout import jsonl
from trollout.recovery.layout import RunLayout
from trollout.recovery.ledger import read_ledger
from trollout.testing import AgentSpec, DeploymentSpec, FakeUrls, Latency
from trollout.testing.tasks import task_rows

TASKS, REPEATS = 500, 4  # 2,000 rollouts
KILLS = 20
SEED = 20261130
SPEC = DeploymentSpec(
    agents=(AgentSpec(name="math_agent"),),
    latency=Latency(fixed_s=0.05, jitter_s=0.15, seed=7),
    record_runs=True,
)
TERMINAL = {"kind": "failure_class", "failure_class": "skipped", "terminal": True}
ALWAYS_500 = {"kind": "status", "status": 500, "body": "boom"}


@pytest.fixture(scope="module")
def fake_spec() -> DeploymentSpec:
    """Unlike the shared fake's: replies take 50-200 ms (seeded)."""
    return SPEC


def write_input(path: Path) -> tuple[set[int], set[int]]:
    """Write the tasks; every 50th is terminal, every 50th+7 always 500; return both sets."""
    rows, terminal, failing = [], set(), set()
    for i, row in enumerate(task_rows(TASKS, seed=5)):
        if i % 50 == 0:
            row["fake_fault"], _ = TERMINAL, terminal.add(i)
        elif i % 50 == 7:
            row["fake_fault"], _ = ALWAYS_500, failing.add(i)
        rows.append(row)
    path.write_bytes(b"".join(jsonl.dumps(r) for r in rows))
    return terminal, failing


def runs_seen(fake: FakeUrls) -> list[tuple[int, int, int]]:
    """Return every (task, rollout, attempt) the fake received, in arrival order."""
    runs = httpx.get(fake.head_url + "/_fake/runs", timeout=30).json()
    return [(t, r, a) for _, _, t, r, a, _ in runs]


def lines(path: Path) -> list[bytes]:
    """Return a file's lines, asserting none is torn (each parses and ends with a newline)."""
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), f"{path.name} ends without a newline"
    out = data.splitlines()
    for number, line in enumerate(out, start=1):
        assert isinstance(orjson.loads(line), dict), f"{path.name}:{number} is not an object"
    return out


def attempts_by_rollout(*paths: Path) -> dict[tuple[int, int], list[int]]:
    """Collect each rollout's attempt numbers across files, in file order per file."""
    seen: dict[tuple[int, int], list[int]] = defaultdict(list)
    for path in paths:
        for line in lines(path):
            row = orjson.loads(line)
            key = (row["_ng_task_index"], row["_ng_rollout_index"])
            seen[key].append(row.get("_ng_attempt_index", 0))
    return seen


def wait_for_moment(proc: subprocess.Popen[bytes], out: Path, rng: random.Random) -> None:
    """Wait for a seeded moment: during start-up (1 in 5), else after 0-80 more rows landed.

    Moments are counted in rows rather than seconds so that every kill lands while the run is
    still going, however fast the machine is; a small seeded delay spreads them within a batch.
    """
    if rng.random() < 0.2:
        time.sleep(rng.uniform(0.05, 0.8))
        return
    target = rng.randint(0, 80)
    start = count_lines(out)
    wait_for(lambda: count_lines(out) - start >= target, f"{target} more rows", proc=proc)
    time.sleep(rng.uniform(0.0, 0.05))


@pytest.mark.slow
def test_crash_sigkill_and_resume_until_done(tmp_path: Path, fake: FakeUrls) -> None:
    """20 SIGKILLs at seeded moments, resumed until done: nothing lost, nothing twice."""
    source = tmp_path / "tasks.jsonl"
    terminal, failing = write_input(source)
    out = tmp_path / "run" / "r.jsonl"
    args = ["collect", str(source), "-o", str(out), "--head-server", fake.head_url,
            "--agent", "math_agent", "--num-repeats", str(REPEATS), "--concurrency", "32",
            "--progress", "plain"]  # fmt: skip
    rng = random.Random(SEED)
    for kill in range(KILLS):
        command = cli_command(*args) if kill == 0 else cli_command(*args, "--resume")
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_for_moment(proc, out, rng)
        proc.send_signal(signal.SIGKILL)  # this pid only
        _, err = proc.communicate()
        assert proc.returncode == -signal.SIGKILL, err.decode()  # killed while still running
    for _ in range(5):  # resume until nothing retryable remains
        done = subprocess.run(cli_command(*args, "--resume"), capture_output=True, timeout=120)
        assert done.returncode == 0, done.stderr.decode()
        status = json.loads(subprocess.run(cli_command("status", str(out), "--json"),
                                           capture_output=True, check=True).stdout)  # fmt: skip
        if not status["retryable_remains"]:
            break
    layout = RunLayout.for_output(out)
    expected = {(t, r) for t in range(TASKS) for r in range(REPEATS)}
    uninterrupted = {(t, r) for t, r in expected if t not in terminal | failing}

    landed = [orjson.loads(line) for line in lines(layout.rollouts)]
    landed_keys = [(row["_ng_task_index"], row["_ng_rollout_index"]) for row in landed]
    assert len(landed_keys) == len(set(landed_keys)), "a rollout landed twice"
    # A rollout killed in flight as often as the cap (3) allows is at the cap, not sent again.
    capped = uninterrupted - set(landed_keys)
    largest: dict[tuple[int, int], int] = {}
    for task, rollout, attempt in read_ledger(layout.attempts):
        largest[(task, rollout)] = max(attempt, largest.get((task, rollout), -1))
    assert all(largest[key] + 1 >= 3 for key in capped), capped
    assert set(landed_keys) <= uninterrupted
    assert any(row.get("_ng_attempt_index", 0) for row in landed), "no kill hit a rollout"
    assert all(row.get("_ng_attempt_index", 0) < 3 for row in landed)
    assert status["landed"] == len(uninterrupted) - len(capped)
    assert status["terminal"] == REPEATS * len(terminal)
    assert status["at_cap"] == REPEATS * len(failing) + len(capped)
    assert status["expected"] == len(expected)
    assert not status["retryable_remains"]

    sent = runs_seen(fake)
    assert len(sent) == len(set(sent)), "an attempt number was sent twice"
    reserved = set(read_ledger(layout.attempts))
    assert set(sent) <= reserved, "an attempt was sent before it was reserved"
    per_rollout = attempts_by_rollout(layout.failures, layout.rollouts)
    for key, numbers in per_rollout.items():
        assert numbers == sorted(set(numbers)), (key, numbers)  # strictly increasing
    for path in (layout.materialized_inputs, layout.attempts):
        lines(path)
    json.loads(layout.manifest.read_text())
    json.loads(layout.batch_status.read_text())


def test_crash_second_collector_fails_at_once_naming_owner(tmp_path: Path, fake: FakeUrls) -> None:
    """A second collect on a folder in use exits 2 while the owner runs, naming its pid."""
    # Tasks 0-3 hang on their first attempt, so the owner (4 workers) runs until killed.
    hangs = {task: {"kind": "hang", "attempts": [0]} for task in range(4)}
    source = write_tasks_input(tmp_path / "tasks.jsonl", 300, seed=1, faults=hangs)
    out = tmp_path / "r.jsonl"
    args = ["collect", str(source), "-o", str(out), "--head-server", fake.head_url,
            "--agent", "math_agent", "--concurrency", "4", "--progress", "plain"]  # fmt: skip
    owner = subprocess.Popen(
        cli_command(*args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        # The rollouts file appears once the owner holds the lock.
        wait_for(out.exists, "the owner's rollouts file", proc=owner)
        for extra in ((), ("--resume",)):
            # A second collector that waited for the lock would wait until the hang guard.
            second = subprocess.run(
                cli_command(*args, *extra), capture_output=True, timeout=HANG_GUARD_S
            )
            assert second.returncode == 2, second.stderr.decode()
            message = second.stderr.decode()
            assert f"another trollout (pid {owner.pid}) is collecting into" in message
        assert owner.poll() is None  # the owner was not disturbed
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    resumed = subprocess.run(
        cli_command(*args, "--resume", "--concurrency", "128"),
        capture_output=True,
        timeout=HANG_GUARD_S,
    )
    assert resumed.returncode == 0, resumed.stderr.decode()  # the OS released the lock
