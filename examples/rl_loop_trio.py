"""An RL training loop on trollout's Trio API: one collector across steps, a batch per step.

Each step samples prompts, asks for a group of rollouts per prompt (GRPO-style), reads the
outcomes as they finish, turns each finished group into advantages for the "learner" (a stub
here), and leaves the batch once 90 % of the rollouts are in: the stragglers are cancelled,
and the collector, its connections and the other steps are untouched. With ``--record-dir``
each step is recorded as a shard (``rollouts-step-NNNN.jsonl``) that ``trollout resume``
finishes and ``trollout aggregate`` merges.

    python examples/rl_loop_trio.py --steps 3                     # against the bundled fake
    python examples/rl_loop_trio.py --agent-url math_agent=http://127.0.0.1:12001 --steps 3
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from collections import defaultdict
from collections.abc import Iterator

import trio

import trollout
from trollout.testing import AgentSpec, DeploymentSpec, spawn_fake_deployment, task_rows

GROUP = 4  # rollouts per prompt
KEEP = 0.9  # leave a step once this share of its rollouts is in


def learn(groups: dict[int, list[float]]) -> float:
    """The learner, stubbed: mean absolute advantage over the finished groups."""
    advantages = [
        reward - statistics.fmean(rewards)
        for rewards in groups.values()
        if len(rewards) == GROUP
        for reward in rewards
    ]
    return statistics.fmean(abs(a) for a in advantages) if advantages else 0.0


async def train(urls: dict[str, str], steps: int, prompts: int, record_dir: str | None) -> None:
    """Run the loop: a batch per step on one long-lived Rollouts."""
    config = trollout.RunConfig(agent_name="math_agent", num_repeats=GROUP)
    async with trollout.open_rollouts(urls, config=config, record_output_dir=record_dir) as ro:
        for step in range(steps):
            rows = ro.plan(list(task_rows(prompts, seed=step)))  # indices, repeats, agent
            shard = f"step-{step:04d}" if record_dir else None
            groups: dict[int, list[float]] = defaultdict(list)
            seen = 0
            async with ro.open_batch(rows, record_shard=shard) as batch:
                async for item in batch:  # completion order
                    seen += 1
                    if item.reward is not None:
                        groups[item.row["_ng_task_index"]].append(item.reward)
                    if seen >= KEEP * len(rows):
                        break  # leaving the block cancels the stragglers of this batch only
            print(
                f"step {step}: {seen}/{len(rows)} rollouts, run {batch.run_id}, "
                f"mean |advantage| {learn(groups):.3f}"
            )


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
        trio.run(train, urls, args.steps, args.prompts, args.record_dir)


if __name__ == "__main__":
    main()
