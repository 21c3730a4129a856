"""A property test of a training step, to copy: whatever the servers do, no rollout is lost.

Hypothesis draws a fault script (what the fake deployment does to each request of each
attempt: 429s with Retry-After, 5xx, resets, garbage, kill-shaped replies, delays) and the
moment the step gives up waiting; the test runs the step against the bundled fake and checks
the invariants your trainer relies on. Run it with pytest:

    pip install 'trollout[testing]' pytest
    pytest examples/property_test.py

Replace `training_step` with your own code; keep the checks that matter to you.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import trollout
from trollout.collector.engine.sink import ListSink
from trollout.testing import AgentSpec, DeploymentSpec, FaultScript, open_fake_deployment, task_rows
from trollout.testing.strategies import fault_scripts

PROMPTS = 6
SPEC = DeploymentSpec(agents=(AgentSpec(name="math_agent"),), record_runs=False)
CONFIG = trollout.RunConfig(
    agent_name="math_agent", retry_backoff_base_s=0.0, rollout_timeout_s=5.0
)


async def training_step(rollouts: trollout.Rollouts, keep: int, sink: ListSink) -> list[Any]:
    """The code under test: one step that stops reading after `keep` outcomes."""
    rows = rollouts.plan(list(task_rows(PROMPTS, seed=0)))
    seen = []
    async with rollouts.collector.open_batch(rows, sink=sink) as batch:
        async for item in batch:
            seen.append(item)
            if len(seen) >= keep:
                break  # the rest is cancelled when the block is left
    return seen


@settings(max_examples=25, deadline=None)
@given(script=fault_scripts(tasks=PROMPTS), keep=st.integers(1, PROMPTS))
def test_a_step_loses_no_rollout(script: dict[Any, Any], keep: int) -> None:
    """Every rollout the step started settles exactly once; what it read is among them."""

    async def main() -> tuple[list[Any], ListSink]:
        sink = ListSink()
        async with (
            open_fake_deployment(SPEC, fault_fn=FaultScript(entries=script)) as fake,
            trollout.open_rollouts(fake.run_urls, config=CONFIG) as rollouts,
        ):
            seen = await training_step(rollouts, keep, sink)
        return seen, sink

    seen, sink = trio.run(main)
    settled = Counter(outcome.identity.task_index for outcome in sink.outcomes)
    assert set(settled.values()) == {1}  # exactly once each
    assert {item.row["_ng_task_index"] for item in seen} <= set(settled)
    assert len(seen) == min(keep, PROMPTS)
