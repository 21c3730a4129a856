"""The four bad days of issue 21 through the real `trollout collect` against the bundled fake in
its own process: what the command exits with, what lands, what fails, what the server took.

How long each takes is asserted on the fake clock in tests/collector/dispatch/test_bad_days.py and
measured on the wall clock by bench/retry_days.py; here nothing waits on time.
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from builders import HANG_GUARD_S, cli_command, read_jsonl, write_tasks_input
from trollout import jsonl
from trollout.testing import DeploymentSpec, FakeUrls, spawn_fake_deployment


@pytest.fixture
def fake_per_test(fake_spec: DeploymentSpec) -> Iterator[FakeUrls]:
    """Unlike the shared `fake` (one per module): one per test, since the fake numbers requests
    per rollout for the whole of its life. Faults come from each row's ``fake_fault``."""
    with spawn_fake_deployment(fake_spec) as urls:
        yield urls


def received(fake: FakeUrls) -> Counter[str]:
    """The fake's requests by path so far (its ``/_fake/stats``)."""
    stats = httpx.get(f"{fake.head_url}/_fake/stats", timeout=10).json()
    return Counter(stats["by_path"])


def collect(
    tmp_path: Path, rows: int, *settings: str, faults: Mapping[int, Mapping[str, Any]]
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run `trollout collect` on `rows` tasks with `settings`; return the process and output."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", rows, seed=5, faults=faults)
    output = tmp_path / "run" / "rollouts.jsonl"
    command = cli_command(
        "collect", str(source), "-o", str(output), "--progress", "plain", "--no-aggregate"
    )
    done = subprocess.run(
        [*command, *settings], capture_output=True, text=True, timeout=HANG_GUARD_S, check=False
    )
    return done, output


def failure_kinds(output: Path) -> Counter[str]:
    """The kinds of the failure rows in the run's sidecar."""
    sidecar = output.with_name(output.stem + "_failures.jsonl")
    if not sidecar.exists():
        return Counter()
    return Counter(row.get("failure_kind") for row in jsonl.read_rows(sidecar))


def test_a_dead_port_stops_the_run_in_one_line_and_loses_nothing(tmp_path: Path) -> None:
    """40 rollouts at 8 in flight to a port that refuses: exit 1 with one line naming the agent,
    its endpoint and how long it gave no answer; no rollout spent an attempt, so resume runs
    all 40 (the grace is shortened to keep the test short: the fake-clock tests time it)."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    done, output = collect(
        tmp_path,
        10,
        "--agent-url",
        f"math_agent=http://127.0.0.1:{port}",
        "--agent",
        "math_agent",
        "--num-repeats",
        "4",
        "--concurrency",
        "8",
        "+dispatch_connect_grace_s=1",
        faults={},
    )
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("trollout: error:")]
    assert len(errors) == 1, done.stderr
    assert f"'math_agent' is down: http://127.0.0.1:{port} gave no answer for" in errors[0]
    assert "bring it back, then resume" in errors[0]
    assert not output.exists() or read_jsonl(output) == []
    status = json.loads(output.with_name(output.stem + "_batch_status.json").read_text())
    assert status["completed"] == 0
    resumed = subprocess.run(
        cli_command("status", str(output), "--json"),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert (json.loads(resumed.stdout)["to_dispatch"], json.loads(resumed.stdout)["landed"]) == (
        40,
        0,
    )


def test_429_forever_fails_each_rollout_after_a_bounded_number_of_requests(
    fake_per_test: FakeUrls, tmp_path: Path
) -> None:
    """Every request answered 429 (no Retry-After): each rollout fails http_429 after at most
    1 + 3 requests, and the run ends on its own, exit 0."""
    before = received(fake_per_test)["/run"]
    done, output = collect(
        tmp_path,
        40,
        "--head-server",
        fake_per_test.head_url,
        "--agent",
        "math_agent",
        "--concurrency",
        "8",
        "+retry_backoff_base_s=0.01",
        faults={task: {"kind": "status", "status": 429} for task in range(40)},
    )
    assert done.returncode == 0, done.stderr
    sent = received(fake_per_test)["/run"] - before
    assert 40 < sent <= 40 * 4
    assert failure_kinds(output) == Counter({"http_429": 40})


def test_a_polite_server_is_waited_for_and_every_rollout_lands(
    fake_per_test: FakeUrls, tmp_path: Path
) -> None:
    """16 rollouts, each answered 429 + Retry-After: 0.05 twice, then 200: all 16 land, no
    failure row, the server took exactly 48 requests."""
    polite = {"kind": "status", "status": 429, "retry_after": 0.05, "requests": [0, 1]}
    before = received(fake_per_test)["/run"]
    done, output = collect(
        tmp_path,
        16,
        "--head-server",
        fake_per_test.head_url,
        "--agent",
        "math_agent",
        "--concurrency",
        "16",
        faults=dict.fromkeys(range(16), polite),
    )
    assert done.returncode == 0, done.stderr
    assert len(read_jsonl(output)) == 16
    assert failure_kinds(output) == Counter()
    assert received(fake_per_test)["/run"] - before == 48
    assert "retries 32" in done.stdout


def test_a_mixed_fault_day_ends_with_every_rollout_settled(
    fake_per_test: FakeUrls, tmp_path: Path
) -> None:
    """20 tasks x 3 repeats: 503 on a first request (retried, lands), 500, a reset after the
    request, a body that is not JSON, in the issue's shares: every rollout lands or fails typed,
    exit 0; the 503s all land."""
    mix = (
        [{"kind": "status", "status": 503, "requests": [0]}] * 2
        + [{"kind": "status", "status": 500}] * 3
        + [{"kind": "reset_mid_request"}] * 2
        + [{"kind": "not_json"}] * 2
    )
    faults = {task: mix[task] for task in range(len(mix))}
    done, output = collect(
        tmp_path,
        20,
        "--head-server",
        fake_per_test.head_url,
        "--agent",
        "math_agent",
        "--num-repeats",
        "3",
        "--concurrency",
        "8",
        faults=faults,
    )
    assert done.returncode == 0, done.stderr
    landed = read_jsonl(output)
    kinds = failure_kinds(output)
    assert len(landed) + sum(kinds.values()) == 60
    assert kinds == Counter({"http_500": 9, "reset": 6, "malformed_body": 6})
    assert {r["_ng_task_index"] for r in landed} >= {0, 1}  # the 503s were retried and landed
