"""Checks of `driver.asyncio_agent`, run as a script: trio-asyncio patches asyncio for the
whole process when imported, so it never enters the test runner's process."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import trio

import trollout
from trollout.driver.asyncio_agent import open_asyncio_agents
from trollout.records import Failed, Landed

cancelled: list[int] = []


async def arithmetic(row: dict) -> dict:
    """An asyncio agent: awaits asyncio things, answers with a reward."""
    lock = asyncio.Lock()
    async with lock:
        await asyncio.sleep(0.001 * (row["_ng_task_index"] % 3))
    return {"response": {"output": []}, "reward": float(row["_ng_task_index"] % 2)}


async def broken(row: dict) -> dict:
    """An asyncio agent with a bug."""
    raise ValueError("agent bug")


async def stuck(row: dict) -> dict:
    """An asyncio agent that never answers; records its cancellation."""
    try:
        await asyncio.sleep(3600)
    finally:
        cancelled.append(row["_ng_task_index"])
    return {}


def rows(agent: str, n: int) -> list[dict]:
    return [
        {"responses_create_params": {"input": []}, "agent_ref": {"name": agent},
         "_ng_task_index": i, "_ng_rollout_index": 0}
        for i in range(n)
    ]  # fmt: skip


async def collect(transport: Any) -> None:
    """Three batches through the asyncio agents: landed, failed, closed while stuck."""
    async with trollout.open_rollouts(transport.urls, transport=transport) as ro:
        landed = await ro.run_batch(rows("arithmetic", 20))
        assert all(isinstance(i.outcome, Landed) for i in landed), landed
        assert sum(i.reward or 0 for i in landed) == 10
        (failed,) = await ro.run_batch(rows("broken", 1))
        assert isinstance(failed.outcome, Failed), failed
        assert (failed.outcome.kind, failed.outcome.exception_type) == ("transport", "ValueError")
        async with ro.open_batch(rows("stuck", 3)) as batch:
            with trio.move_on_after(0.2):
                async for _ in batch:
                    pass
            left = await batch.aclose_and_drain()
        assert left == [], left


async def main() -> None:
    agents = {"arithmetic": arithmetic, "broken": broken, "stuck": stuck}
    async with open_asyncio_agents(agents) as transport:
        await collect(transport)
    assert sorted(cancelled) == [0, 1, 2], cancelled
    print("ok")


if __name__ == "__main__":
    trio.run(main)
    sys.exit(0)
