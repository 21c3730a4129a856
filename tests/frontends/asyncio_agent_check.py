"""Checks of `frontends.asyncio_agent`, run as a script: trio-asyncio patches asyncio for the
whole process when imported, so it never enters the test runner's process."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import orjson
import trio
import trio.testing

import trollout
from trollout.frontends.asyncio_agent import open_asyncio_agents
from trollout.records import Failed, Landed

cancelled: list[int] = []
entered: list[int] = []


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
    """An asyncio agent that never answers; records its start and its cancellation."""
    entered.append(row["_ng_task_index"])
    try:
        await asyncio.sleep(3600)
    finally:
        cancelled.append(row["_ng_task_index"])
    return {}


async def cancels_itself(row: dict) -> dict:
    """An asyncio agent (or an SDK in it) letting an asyncio cancellation of its own escape."""
    if row["_ng_task_index"] == 1:
        raise asyncio.CancelledError("the SDK cancelled its own request")
    return {"response": {"output": []}, "reward": 1.0}


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


async def self_cancel(transport: Any) -> None:
    """An agent's own asyncio cancellation fails that rollout only; the collector goes on."""
    async with trollout.open_rollouts(transport.urls, transport=transport) as ro:
        outcomes = await ro.run_batch(rows("cancels_itself", 3))
        kinds = sorted(type(i.outcome).__name__ for i in outcomes)
        assert kinds == ["Failed", "Landed", "Landed"], outcomes
        (failed,) = [i.outcome for i in outcomes if isinstance(i.outcome, Failed)]
        assert (failed.kind, failed.exception_type) == ("transport", "RuntimeError"), failed
        again = await ro.run_batch(rows("arithmetic", 2))
        assert all(isinstance(i.outcome, Landed) for i in again), again


async def trio_cancel(transport: Any) -> None:
    """Trio cancelling a call still raises trio.Cancelled (caught by its scope), not an error."""
    body = orjson.dumps(rows("stuck", 1)[0])
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def call() -> None:
            with scope:
                await transport.post(transport.urls["stuck"] + "/run", body)
            assert scope.cancelled_caught, "the call ended without Trio's cancellation"
            called.set()

        called = trio.Event()
        nursery.start_soon(call)
        await trio.testing.wait_all_tasks_blocked()  # the agent is asleep in asyncio
        assert entered == [0], entered
        scope.cancel()
        await called.wait()
    assert cancelled == [0], cancelled


CHECKS = {"collect": collect, "self_cancel": self_cancel, "trio_cancel": trio_cancel}
AGENTS = {
    "arithmetic": arithmetic,
    "broken": broken,
    "stuck": stuck,
    "cancels_itself": cancels_itself,
}


async def main(check: str) -> None:
    async with open_asyncio_agents(AGENTS) as transport:
        await CHECKS[check](transport)
    if check == "collect":
        assert sorted(cancelled) == [0, 1, 2], cancelled
    print("ok")


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
    sys.exit(0)
