"""The RL loop of rl_loop_trio.py, for an asyncio trainer: ``asyncio.run`` and trollout.aio.

Same steps, same early exit at 90 %, same optional shards; trollout runs in a Trio thread of
its own, so the trainer's other asyncio tasks (here, a heartbeat every 10 ms) keep their pace.

    python examples/rl_loop_asyncio.py --steps 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from collections import defaultdict
from collections.abc import Iterator

import trollout
from trollout.testing import AgentSpec, DeploymentSpec, spawn_fake_deployment, task_rows

GROUP = 4
KEEP = 0.9


def learn(groups: dict[int, list[float]]) -> float:
    """The learner, stubbed: mean absolute advantage over the finished groups."""
    advantages = [
        reward - statistics.fmean(rewards)
        for rewards in groups.values()
        if len(rewards) == GROUP
        for reward in rewards
    ]
    return statistics.fmean(abs(a) for a in advantages) if advantages else 0.0


async def heartbeat(stop: asyncio.Event, gaps: list[float]) -> None:
    """Another task of the trainer: it should never wait much longer than its 10 ms."""
    last = time.monotonic()
    while not stop.is_set():
        await asyncio.sleep(0.01)
        now = time.monotonic()
        gaps.append(now - last)
        last = now


async def train(urls: dict[str, str], steps: int, prompts: int, record_dir: str | None) -> None:
    """Run the loop: a batch per step on one long-lived asyncio Rollouts."""
    stop, gaps = asyncio.Event(), [0.0]
    beat = asyncio.create_task(heartbeat(stop, gaps))
    config = trollout.RunConfig(agent_name="math_agent", num_repeats=GROUP)
    async with trollout.aio.open_rollouts(urls, config=config, record_output_dir=record_dir) as ro:
        for step in range(steps):
            rows = ro.plan(list(task_rows(prompts, seed=step)))
            shard = f"step-{step:04d}" if record_dir else None
            groups: dict[int, list[float]] = defaultdict(list)
            seen = 0
            async with ro.open_batch(rows, record_shard=shard) as batch:
                async for item in batch:
                    seen += 1
                    if item.reward is not None:
                        groups[item.row["_ng_task_index"]].append(item.reward)
                    if seen >= KEEP * len(rows):
                        break
            print(
                f"step {step}: {seen}/{len(rows)} rollouts, run {batch.run_id}, "
                f"mean |advantage| {learn(groups):.3f}"
            )
    stop.set()
    await beat
    print(f"longest heartbeat gap: {max(gaps) * 1000:.1f} ms")


@contextlib.contextmanager
def deployment(agent_urls: list[str]) -> Iterator[dict[str, str]]:
    """The agents to use: the ones given, else the bundled fake in a subprocess."""
    if agent_urls:
        yield dict(item.split("=", 1) for item in agent_urls)
        return
    with spawn_fake_deployment(DeploymentSpec(agents=(AgentSpec(name="math_agent"),))) as fake:
        yield fake.run_urls


def main() -> None:
    """Parse the command line and train."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent-url", action="append", default=[], metavar="NAME=URL")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--record-dir", default=None)
    args = parser.parse_args()
    with deployment(args.agent_url) as urls:
        asyncio.run(train(urls, args.steps, args.prompts, args.record_dir))


if __name__ == "__main__":
    main()
