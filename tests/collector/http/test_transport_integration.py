"""End to end against the fake deployment: a 2 GB reply, a slowloris, replies nobody asked for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from trollout import jsonl
from trollout.cli.collect import collect_run
from trollout.recovery.layout import RunLayout
from trollout.settings import RunConfig
from trollout.testing import (
    AgentSpec,
    DeploymentSpec,
    Fault,
    FaultPlan,
    Generation,
    open_fake_deployment,
    spawn_fake_deployment,
    task_row,
    write_tasks,
)

MIB = 1024 * 1024


def read(path: Path) -> list[dict[str, Any]]:
    """Read a JSONL file (empty when absent)."""
    return list(jsonl.read_rows(path)) if path.exists() else []


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write `rows` as a JSONL file."""
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))


# Runs the CLI and, at exit, writes its own VmHWM (peak RSS of this process image only: a
# child's rusage would count the pytest process it was forked from).
PEAK_REPORTER = """
import atexit, sys
def report(path=sys.argv[1]):
    with open("/proc/self/status") as status, open(path, "w") as out:
        out.write(next(line for line in status if line.startswith("VmHWM")))
atexit.register(report)
sys.argv = ["trollout", *sys.argv[2:]]
from trollout.cli.main import main
main()
"""


def collect_measured(tmp_path: Path, head: str, *extra: str) -> tuple[int, float]:
    """Run `trollout collect` on tmp_path/tasks.jsonl; return its exit code and peak RSS (MiB)."""
    peak = tmp_path / "peak.txt"
    command = [sys.executable, "-c", PEAK_REPORTER, str(peak), "collect"]
    command += [str(tmp_path / "tasks.jsonl"), "-o", str(tmp_path / "run" / "r.jsonl")]
    command += ["--head-server", head, "--agent", "math_agent", "--progress", "plain"]
    command += ["--no-aggregate", *extra]
    with (tmp_path / "out.txt").open("w") as out, (tmp_path / "err.txt").open("w") as err:
        code = subprocess.run(command, stdout=out, stderr=err, check=False).returncode
    return code, int(peak.read_text().split()[1]) / 1024  # "VmHWM:  123456 kB"


@pytest.mark.parametrize("until_eof", [False, True])
def test_collect_2gb_reply_fails_typed_within_the_memory_limit(
    tmp_path: Path, until_eof: bool
) -> None:
    """A 2 GB reply (a declared length, or streamed until EOF) to `trollout collect
    --max-reply-bytes 64 MiB` is a reply_too_large failure, and the collector's peak RSS stays
    under the limit plus 100 MB."""
    huge = {"kind": "oversized", "status": 200, "size": 2_000_000_000, "until_eof": until_eof}
    write_rows(tmp_path / "tasks.jsonl", [task_row("What is 2 + 3?") | {"fake_fault": huge}])
    spec = DeploymentSpec(agents=(AgentSpec(name="math_agent"),), record_runs=False)
    with spawn_fake_deployment(spec) as urls:
        code, peak_mib = collect_measured(
            tmp_path, urls.head_url, "--max-reply-bytes", str(64 * MIB)
        )
    assert code == 0, (tmp_path / "err.txt").read_text()
    layout = RunLayout.for_output(tmp_path / "run" / "r.jsonl")
    assert read(layout.rollouts) == []
    [failure] = read(layout.failures)
    assert (failure["_ng_failure_class"], failure["failure_kind"]) == (
        "agent_request_failed",
        "reply_too_large",
    )
    assert f"max_reply_bytes={64 * MIB}" in failure["_ng_failure_message"]
    assert "--max-reply-bytes" in failure["_ng_failure_message"]
    assert peak_mib < 64 + 100 * 1e6 / MIB, peak_mib


async def test_collect_slowloris_fails_at_the_reply_deadline(tmp_path: Path) -> None:
    """A server that sends a byte every 50 ms forever fails the rollout as reply_timeout."""
    trickle = {"kind": "slowloris", "interval_s": 0.05}
    write_rows(tmp_path / "tasks.jsonl", [task_row("What is 2 + 3?") | {"fake_fault": trickle}])
    async with open_fake_deployment(DeploymentSpec(agents=("math_agent",))) as fake:
        config = RunConfig(
            input_jsonl_fpath=str(tmp_path / "tasks.jsonl"),
            output_jsonl_fpath=str(tmp_path / "run" / "r.jsonl"),
            head_server=fake.head_url,
            read_timeout_s=10.0,
            reply_timeout_s=0.5,
            agent_name="math_agent",
            disable_aggregation=True,
        )
        await collect_run(config, live=False)
    [failure] = read(RunLayout.for_output(tmp_path / "run" / "r.jsonl").failures)
    assert (failure["_ng_failure_class"], failure["failure_kind"]) == (
        "agent_request_failed",
        "reply_timeout",
    )
    assert "reply_timeout_s=0.5" in failure["_ng_failure_message"]


async def test_collect_unsolicited_replies_never_land(tmp_path: Path) -> None:
    """Every reply is followed, 50 ms later on the same connection, by a replay or a forged
    copy of itself: at concurrency 16, no row holds another rollout's reply or a forged body,
    and every landed rollout's request reached the server."""
    strays = (
        (Fault(kind="unsolicited_reply", interval_s=0.05), 1.0),
        (Fault(kind="unsolicited_reply", interval_s=0.05, body="FORGED"), 1.0),
    )
    spec = DeploymentSpec(
        agents=(AgentSpec(name="math_agent"),),
        generation=Generation.LEGACY,  # agents echo the row, identity included
        faults=FaultPlan(seed=1, rate=1.0, mix=strays),
    )
    write_tasks(tmp_path / "tasks.jsonl", 150, seed=3)
    async with open_fake_deployment(spec) as fake:
        config = RunConfig(
            input_jsonl_fpath=str(tmp_path / "tasks.jsonl"),
            output_jsonl_fpath=str(tmp_path / "run" / "r.jsonl"),
            head_server=fake.head_url,
            agent_name="math_agent",
            num_repeats=2,
            num_repeats_add_seed=True,  # every rollout's params, hence its echo, differ
            num_samples_in_parallel=16,
            disable_aggregation=True,
        )
        await collect_run(config, live=False)
        received = {(run.task_index, run.rollout_index) for run in fake.stats.runs}
    layout = RunLayout.for_output(config.output_jsonl_fpath or "")
    sent = {
        (r["_ng_task_index"], r["_ng_rollout_index"]): r for r in read(layout.materialized_inputs)
    }
    landed, failures = read(layout.rollouts), read(layout.failures)
    for row in landed:
        key = (row["_ng_task_index"], row["_ng_rollout_index"])
        assert key in received
        assert row["responses_create_params"] == sent[key]["responses_create_params"]
        assert row["response"]["output"][0]["content"][0]["text"] != "FORGED"
    assert {failure["failure_kind"] for failure in failures} <= {"identity_mismatch"}
    assert len(landed) + len(failures) == 300
    assert failures  # the strays did reach requests in flight, and were caught
