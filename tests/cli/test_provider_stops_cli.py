"""A provider's refusal stops the run, through the real `trollout collect` against the bundled
fake in its own process (issue 25, item 3): a producer's failure rows of kind
``credentials_rejected``, a failed /run whose headers forward that kind, and ``quota_exhausted``.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from builders import HANG_GUARD_S, cli_command, read_jsonl, write_tasks_input
from trollout.testing import DeploymentSpec, FakeUrls, spawn_fake_deployment


@pytest.fixture
def fake_per_test(fake_spec: DeploymentSpec) -> Iterator[FakeUrls]:
    """One fake per test: faults come from each row's ``fake_fault``."""
    with spawn_fake_deployment(fake_spec) as urls:
        yield urls


def collect(
    tmp_path: Path, fake: FakeUrls, fault: Mapping[str, Any]
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Collect 8 tasks, one at a time, every row carrying `fault`."""
    source = write_tasks_input(
        tmp_path / "tasks.jsonl", 8, seed=3, faults=dict.fromkeys(range(8), fault)
    )
    output = tmp_path / "run" / "rollouts.jsonl"
    command = cli_command(
        "collect", str(source), "-o", str(output), "--head-server", fake.head_url, "--agent",
        "math_agent", "--concurrency", "1", "--progress", "plain", "--no-aggregate",
    )  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=HANG_GUARD_S, check=False
    )
    return done, output


def sidecar(output: Path) -> list[dict[str, Any]]:
    return read_jsonl(output.with_name(output.stem + "_failures.jsonl"))


def status(output: Path) -> dict[str, Any]:
    saved: dict[str, Any] = json.loads(
        output.with_name(output.stem + "_batch_status.json").read_text()
    )
    return saved


def error_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("trollout: error:")]


def test_failure_rows_saying_credentials_rejected_stop_the_run(
    fake_per_test: FakeUrls, tmp_path: Path
) -> None:
    """Every reply a producer's failure row of kind credentials_rejected: the run stops after
    stop_after_auth_failures (5) such rollouts, exit 1, one line naming the server and the
    kind; the rollouts not yet sent (one more may be in flight at the stop) are left for a
    resume once the key is fixed."""
    fault = {
        "kind": "failure_class",
        "failure_class": "agent_run_error",
        "failure_kind": "credentials_rejected",
    }
    done, output = collect(tmp_path, fake_per_test, fault)
    assert done.returncode == 1, done.stderr
    [line] = error_lines(done)
    assert (
        "credentials rejected by 'math_agent_environment_server': failure kind "
        "credentials_rejected on 5" in line
    )
    rows = sidecar(output)
    assert len(rows) in (5, 6)
    assert {r["failure_kind"] for r in rows} == {"credentials_rejected"}
    saved = status(output)
    assert (saved["failed"], saved["finished"]) == (len(rows), False)
    assert saved["omitted"] + saved["not_started"] == 8 - len(rows)  # left for a resume


def test_a_failed_run_forwarding_credentials_rejected_in_its_headers_stops_the_run(
    fake_per_test: FakeUrls, tmp_path: Path
) -> None:
    """HTTP 500 whose X-NG-Failure-Report names credentials_rejected behind the agent's own
    routing failure: the rows take that kind and keep the report, and the run stops."""
    fault = {"kind": "status", "status": 500, "failure_kind": "credentials_rejected"}
    done, output = collect(tmp_path, fake_per_test, fault)
    assert done.returncode == 1, done.stderr
    assert "failure kind credentials_rejected on 5 consecutive rollouts" in error_lines(done)[0]
    rows = sidecar(output)
    assert len(rows) in (5, 6)
    first = rows[0]
    assert (first["_ng_failure_class"], first["failure_kind"]) == (
        "agent_run_error",
        "credentials_rejected",
    )
    assert first["_ng_failure_http_status"] == 500
    assert [e["kind"] for e in first["_ng_failure_events"]] == [
        "agent_run_error",
        "credentials_rejected",
    ]


def test_a_failure_row_saying_quota_exhausted_stops_the_run_at_once(
    fake_per_test: FakeUrls, tmp_path: Path
) -> None:
    """The first rollout whose failure kind is quota_exhausted stops the run: exit 1, at most
    the one in flight at the stop also spent."""
    fault = {
        "kind": "failure_class",
        "failure_class": "judge_failed",
        "failure_kind": "quota_exhausted",
    }
    done, output = collect(tmp_path, fake_per_test, fault)
    assert done.returncode == 1, done.stderr
    assert (
        "quota exhausted at 'math_agent_environment_server' (failure kind quota_exhausted)"
        in error_lines(done)[0]
    )
    assert len(sidecar(output)) in (1, 2)
    saved = status(output)
    assert saved["omitted"] + saved["not_started"] == 8 - len(sidecar(output))
