"""Attempt numbers mean attempts (issue 21, item 5), through the real CLI and the fake.

A run of 48 rollouts at 8 in flight against a fake deployment (its own process) that holds every
``/run`` for 1.5 s is interrupted five times mid-flight, by SIGKILL and SIGTERM in turn, each
time while all 8 requests are held by the fake, and resumed with ``trollout resume`` each time.
No landed row may carry a larger ``_ng_attempt_index`` than the number of attempts the fake saw
of that rollout, nor reach ``--max-attempts``; the fake never sees one number twice; every
rollout lands or is accounted for.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from builders import HANG_GUARD_S, cli_command, wait_for, write_tasks_input
from trollout.recovery.layout import RunLayout
from trollout.recovery.ledger import read_ledger
from trollout.testing import AgentSpec, DeploymentSpec, FakeUrls, Latency, spawn_fake_deployment

ROLLOUTS = 48
CONCURRENCY = 8
MAX_ATTEMPTS = 3
SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGKILL, signal.SIGTERM, signal.SIGKILL)


@pytest.fixture
def held_fake() -> Iterator[FakeUrls]:
    """A fake deployment in its own process that holds every /run for 1.5 s, logging each."""
    spec = DeploymentSpec(agents=(AgentSpec(name="math_agent"),), latency=Latency(fixed_s=1.5))
    with spawn_fake_deployment(spec, record_runs=True) as urls:
        yield urls


def runs_received(fake: FakeUrls) -> int:
    """Return how many /run requests the fake has received."""
    stats: dict[str, Any] = httpx.get(fake.head_url + "/_fake/stats", timeout=30).json()
    return int(stats["runs_total"])


def attempts_seen(fake: FakeUrls) -> list[tuple[int, int, int]]:
    """Return ``(task, rollout, attempt)`` of every /run the fake received."""
    runs = httpx.get(fake.head_url + "/_fake/runs", timeout=30).json()
    return [(task, rollout, attempt) for _, _, task, rollout, attempt, _ in runs]


def interrupt_mid_flight(command: list[str], fake: FakeUrls, signum: int) -> None:
    """Run ``command``; once its second wave of 8 is held by the fake, send ``signum``."""
    base = runs_received(fake)
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # 16 arrivals: the first 8 were answered (only 8 are ever in flight) and 8 more are
        # held, so every worker's request is at the fake and no number waits to be sent.
        wait_for(lambda: runs_received(fake) >= base + 2 * CONCURRENCY, "16 arrivals", proc=proc)
        proc.send_signal(signum)  # this pid only
        _, err = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    expected = -signal.SIGKILL if signum == signal.SIGKILL else 143
    assert proc.returncode == expected, err.decode()


@pytest.mark.slow
def test_attempt_numbers_count_what_the_server_saw(tmp_path: Path, held_fake: FakeUrls) -> None:
    """Five kills and SIGTERMs mid-flight, resumed each time: numbers count real attempts."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", ROLLOUTS, seed=5)
    out = tmp_path / "run" / "r.jsonl"
    session = ["--head-server", held_fake.head_url, "--concurrency", str(CONCURRENCY),
               "--grace", "0.2", "--progress", "plain", "--no-aggregate"]  # fmt: skip
    first = cli_command("collect", str(source), "-o", str(out), "--agent", "math_agent",
                        "--max-attempts", str(MAX_ATTEMPTS), *session)  # fmt: skip
    resume = cli_command("resume", str(out), *session)
    for i, signum in enumerate(SIGNALS):
        interrupt_mid_flight(first if i == 0 else resume, held_fake, signum)
    done = subprocess.run(resume, capture_output=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr.decode()

    layout = RunLayout.for_output(out)
    seen = attempts_seen(held_fake)
    assert max(Counter(seen).values()) == 1, "the fake saw one attempt number twice"
    assert set(seen) <= set(read_ledger(layout.attempts)), "sent before it was on record"
    numbers: dict[tuple[int, int], set[int]] = defaultdict(set)
    for task, rollout, attempt in seen:
        numbers[(task, rollout)].add(attempt)
    landed = [orjson.loads(line) for line in layout.rollouts.read_bytes().splitlines()]
    indices = {}
    for row in landed:
        key = (row["_ng_task_index"], row["_ng_rollout_index"])
        indices[key] = row.get("_ng_attempt_index", 0)
        assert indices[key] <= len(numbers[key]), (key, indices[key], sorted(numbers[key]))
        assert indices[key] < MAX_ATTEMPTS, (key, indices[key])
    assert len(indices) == len(landed)
    assert max(indices.values()) == 1, "each rollout is interrupted at most once here"
    status = json.loads(
        subprocess.run(
            cli_command("status", str(out), "--json"), capture_output=True, check=True
        ).stdout
    )
    assert status["expected"] == ROLLOUTS
    assert status["landed"] + status["at_cap"] == ROLLOUTS, status
    assert not status["retryable_remains"]
