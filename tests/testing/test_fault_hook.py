"""The fault hook as a product: request index within an attempt, scripts, strategies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings

import trollout
from trollout.errors import ConfigError
from trollout.records import Failed, Landed
from trollout.testing import (
    AgentSpec,
    DeploymentSpec,
    Fault,
    FaultContext,
    FaultScript,
    open_fake_deployment,
    read_fault_script,
    spawn_fake_deployment,
    task_rows,
    write_fault_script,
)
from trollout.testing.strategies import fault_scripts

SPEC = DeploymentSpec(agents=(AgentSpec(name="math_agent"),))
CONFIG = trollout.RunConfig(agent_name="math_agent", retry_backoff_base_s=0.0)
REFUSED = Fault(kind="status", status=429, retry_after=0.0)


async def test_fault_hook_sees_the_request_index_within_its_attempt() -> None:
    """A 429 retried within attempt 0 is request 1 of attempt 0 for the hook."""
    seen: list[tuple[int, int, int]] = []

    def hook(context: FaultContext) -> Fault | None:
        seen.append((context.task_index, context.attempt_index, context.request_index))
        return REFUSED if context.request_index < 2 else None

    async with (
        open_fake_deployment(SPEC, fault_fn=hook) as fake,
        trollout.open_rollouts(fake.run_urls, config=CONFIG) as rollouts,
    ):
        (outcome,) = await rollouts.run_batch(rollouts.plan(list(task_rows(1))))
    assert isinstance(outcome.outcome, Landed)
    assert seen == [(0, 0, 0), (0, 0, 1), (0, 0, 2)]


async def test_a_rows_own_fault_can_name_requests() -> None:
    """fake_fault with requests: [0] refuses the first request only; the retry lands."""
    row = {**next(task_rows(1)), "fake_fault": {"kind": "status", "status": 503, "requests": [0]}}
    async with (
        open_fake_deployment(SPEC) as fake,
        trollout.open_rollouts(fake.run_urls, config=CONFIG) as rollouts,
    ):
        (outcome,) = await rollouts.run_batch(rollouts.plan([row]))
    assert isinstance(outcome.outcome, Landed)
    assert fake.stats.by_status[503] == 1


def test_fault_script_file_drives_the_subprocess_fake(tmp_path: Path) -> None:
    """A script file, appended while the fake runs, scripts each batch by its run id."""
    script = tmp_path / "faults.jsonl"
    fail = Fault(kind="status", status=500)
    with spawn_fake_deployment(SPEC, fault_script=script) as urls:
        for run_id, task in (("one", 1), ("two", 2)):
            write_fault_script(script, {(run_id, task, 0, 0, 0): fail}, append=True)

            async def main(run_id: str = run_id) -> dict[int, Any]:
                async with trollout.open_rollouts(urls.run_urls, config=CONFIG) as rollouts:
                    rows = rollouts.plan(list(task_rows(3)))
                    items = await rollouts.run_batch(rows, run_id=run_id)
                return {item.row["_ng_task_index"]: item.outcome for item in items}

            outcomes = trio.run(main)
            failed = sorted(t for t, o in outcomes.items() if isinstance(o, Failed))
            assert failed == [task]
            assert outcomes[task].http_status == 500


def test_fault_script_refuses_a_bad_line(tmp_path: Path) -> None:
    """A line that is not an entry is one error naming the file and line."""
    path = tmp_path / "faults.jsonl"
    path.write_text('{"task": 0, "fault": {"kind": "hang"}}\n{"task": 1}\n')
    with pytest.raises(ConfigError, match=r"faults.jsonl:2: an entry needs a 'fault'"):
        read_fault_script(path)


def test_fault_script_in_memory_matches_run_then_any() -> None:
    """An entry for the context's run id wins; an entry without one applies to every run."""
    hang, fail = Fault(kind="hang"), Fault(kind="status", status=500)
    script = FaultScript(entries={("r", 0, 0, 0, 0): hang, (None, 0, 0, 0, 0): fail})
    context = FaultContext("s", "a", 0, 0, 0, {}, 0, "r")
    assert script(context) is hang
    assert script(FaultContext("s", "a", 0, 0, 0, {}, 0, "other")) is fail
    assert script(FaultContext("s", "a", 0, 0, 1, {}, 0, "r")) is None


@settings(max_examples=50, deadline=None)
@given(script=fault_scripts(tasks=4, rollouts=2, run_id="x"))
def test_fault_scripts_round_trip_through_a_file(script: Any, tmp_path_factory: Any) -> None:
    """Whatever the strategy draws, writing and reading the script gives it back."""
    path = tmp_path_factory.mktemp("scripts") / "faults.jsonl"
    write_fault_script(path, script)
    assert read_fault_script(path) == script
