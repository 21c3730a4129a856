"""The exactly-once auditor (`trollout.testing.audit`) and the fake's request log by batch.

A shard is recorded for real (the asyncio front end against the fake in its own process), then
audited as written, and again after each file is damaged the way a lost or duplicated rollout
would damage it: each breach is named.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import trollout
from trollout.testing import (
    AgentSpec,
    DeploymentSpec,
    FakeUrls,
    assert_exactly_once,
    audit_run,
    spawn_fake_deployment,
    task_rows,
)

CONFIG = trollout.RunConfig(agent_name="math_agent", num_repeats=2)


@pytest.fixture(scope="module")
def served() -> Iterator[FakeUrls]:
    """The fake in its own process (this folder's `fake` is the in-process Trio one)."""
    with spawn_fake_deployment(DeploymentSpec(agents=(AgentSpec(name="math_agent"),))) as urls:
        yield urls


def record(fake: FakeUrls, folder: Path, label: str) -> tuple[Path, str]:
    """Record a 6-rollout shard; return its rollouts file and the batch's run id."""

    async def main() -> str:
        async with (
            trollout.aio.open_rollouts(
                fake.run_urls, config=CONFIG, record_output_dir=folder
            ) as ro,
            ro.open_batch(ro.plan(list(task_rows(3, seed=2))), record_shard=label) as batch,
        ):
            async for _ in batch:
                pass
            return batch.run_id

    run_id = asyncio.run(main())
    return folder / f"rollouts-{label}.jsonl", run_id


def requests(fake: FakeUrls) -> list[dict[str, Any]]:
    return httpx.get(fake.head_url + "/_fake/requests", timeout=30).json()  # type: ignore[no-any-return]


def test_a_clean_shard_passes_and_the_fake_names_each_request_batch(
    served: FakeUrls, tmp_path: Path
) -> None:
    fake = served
    output, run_id = record(fake, tmp_path, "clean")
    log = requests(fake)
    mine = [entry for entry in log if entry["run_id"] == run_id]
    assert sorted((e["task_index"], e["rollout_index"]) for e in mine) == [
        (t, r) for t in range(3) for r in range(2)
    ]
    (report,) = assert_exactly_once(output, requests=log)
    assert (report.run_id, report.expected, report.landed, report.requests) == (run_id, 6, 6, 6)


def test_each_breach_is_named(served: FakeUrls, tmp_path: Path) -> None:
    fake = served
    output, run_id = record(fake, tmp_path, "bad")
    lines = output.read_text().splitlines()
    first = json.loads(lines[0])
    stray = {**first, "_ng_task_index": 99}
    output.write_text("\n".join([*lines, lines[0], json.dumps(stray)]) + "\n")
    status_path = output.with_name("rollouts-bad_batch_status.json")
    status = json.loads(status_path.read_text())
    status_path.write_text(json.dumps({**status, "completed": 5}))
    log = requests(fake)
    replayed = next(e for e in log if e["run_id"] == run_id)
    problems = audit_run(output, requests=[*log, replayed]).problems
    key = f"task {first['_ng_task_index']} rollout {first['_ng_rollout_index']}"
    assert f"{key} landed 2 times" in problems
    assert any("task 99 rollout" in p and "not a materialized rollout" in p for p in problems)
    assert any("counts 5 completed" in p for p in problems)
    assert any("received" in p and "2 times" in p for p in problems)
    with pytest.raises(AssertionError, match="landed 2 times"):
        assert_exactly_once(tmp_path)


def test_an_accepted_rollout_without_an_outcome_is_named(served: FakeUrls, tmp_path: Path) -> None:
    fake = served
    output, _ = record(fake, tmp_path, "lost")
    lines = output.read_text().splitlines()
    lost = json.loads(lines[-1])
    output.write_text("\n".join(lines[:-1]) + "\n")
    problems = audit_run(output).problems
    key = f"task {lost['_ng_task_index']} rollout {lost['_ng_rollout_index']}"
    assert any(p.startswith(f"{key} was accepted") for p in problems), problems
