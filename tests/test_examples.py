"""Every script in examples/ runs, as a user would run it, against the fake deployment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from builders import HANG_GUARD_S, invoke, read_jsonl
from trollout.recovery.layout import RunLayout
from trollout.testing import AgentSpec, DeploymentSpec, FakeUrls, Latency

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def fake_spec() -> DeploymentSpec:
    """Unlike the shared fake's: replies take 0-300 ms, hashed per rollout.

    In the examples' batches of 8 tasks x 4 the 29th reply comes 25 ms before the 30th, so a
    batch left at 90 % has stragglers to cancel however the rollouts are scheduled. With
    instant replies every rollout of a small batch could land before its consumer reads the
    29th, leaving resume nothing to finish.
    """
    return DeploymentSpec(
        agents=(AgentSpec(name="math_agent"),), latency=Latency(jitter_s=0.3, seed=19)
    )


def run_example(name: str, *args: str) -> str:
    """Run examples/<name> with `args`; return its stdout (it must exit 0)."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def url_args(fake: FakeUrls) -> list[str]:
    """The example's --agent-url option for the fake."""
    return ["--agent-url", f"math_agent={fake.run_urls['math_agent']}"]


def test_example_rl_loop_in_trio_records_shards_the_cli_resumes(
    fake: FakeUrls, tmp_path: Path
) -> None:
    """The Trio loop runs 3 steps, each a shard; resume finishes one, aggregate reads all."""
    out = run_example(
        "rl_loop_trio.py", *url_args(fake), "--steps", "3", "--record-dir", str(tmp_path)
    )
    assert [line.split(":")[0] for line in out.splitlines()] == ["step 0", "step 1", "step 2"]
    assert "29/32 rollouts" in out  # left at 90 %: the stragglers were cancelled
    shard = RunLayout.for_output(tmp_path / "rollouts-step-0001.jsonl")
    # How many stragglers were cut off depends on the machine's speed (on a busy one all may
    # have landed before the batch closed); resume must send exactly those, and finish.
    before = len(read_jsonl(shard.rollouts))
    result = invoke("resume", str(shard.output), "--progress", "plain", "--no-aggregate")
    assert result.exit_code == 0, result.output
    assert f"dispatched {32 - before}" in result.output
    assert len(read_jsonl(shard.rollouts)) == 32
    again = invoke("resume", str(shard.output), "--progress", "plain", "--no-aggregate")
    assert again.exit_code == 0, again.output
    assert "dispatched 0" in again.output
    merged = tmp_path / "merged" / "all.jsonl"
    shards = sorted(tmp_path.glob("rollouts-step-*[0-9].jsonl"))
    landed = sum(len(read_jsonl(path)) for path in shards)
    result = invoke("aggregate", str(tmp_path / "rollouts-step-*.jsonl"), "-o", str(merged))
    if landed == 3 * 32:  # a busy machine may land every straggler before its batch closed
        assert result.exit_code == 0, result.output
    else:  # the stragglers the loop cut off are missing, and aggregate says so
        assert result.exit_code == 75, result.output
        assert f"{96 - landed} of 96 planned rollouts have no outcome" in result.output


def test_example_rl_loop_under_asyncio_run(fake: FakeUrls) -> None:
    """The asyncio loop runs its steps; its heartbeat task kept beating (a figure)."""
    out = run_example("rl_loop_asyncio.py", *url_args(fake), "--steps", "2")
    assert "step 1: 29/32 rollouts" in out
    assert "longest heartbeat gap" in out


def test_example_sync_script(fake: FakeUrls) -> None:
    """The blocking script runs a whole batch, then one closed early."""
    out = run_example("sync_script.py", *url_args(fake))
    assert "batch 1: {'Landed': 16}" in out
    assert "batch 2: first was task" in out


def test_example_property_test_passes() -> None:
    """The property test users copy passes as shipped."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(EXAMPLES / "property_test.py"),
        ],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=False,
        cwd=EXAMPLES.parent,
    )
    assert done.returncode == 0, done.stdout + done.stderr
