"""What one rollout costs the scheduler: task steps per rollout through the engine.

Each task step is a switch into a task (Trio's ``before_task_step``), the unit the engine's
design counts when it keeps a rollout's path short (pool.py): a worker takes the next lent row
and a free concurrency slot itself, without a switch, and the feeder wakes once per batch.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.abc

from builders import collect_scripted


class _StepCounter(trio.abc.Instrument):
    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1


@pytest.mark.parametrize("concurrency", [1, 8, 64])
async def test_engine_task_steps_per_rollout(autojump_clock: Any, concurrency: int) -> None:
    """A rollout costs at most 2.5 task steps (4.2-5.0 when each row and slot was a switch).

    What is left: the worker waking to its reply, the writer's round (shared by the outcomes
    settled together), the feeder once per lent batch and, at concurrency 1, the fake clock.
    """
    counter = _StepCounter()
    trio.lowlevel.add_instrument(counter)
    try:
        collector = await collect_scripted(512, num_samples_in_parallel=concurrency)
    finally:
        trio.lowlevel.remove_instrument(counter)
    assert collector.progress.landed == 512
    assert counter.steps / 512 <= 2.5
