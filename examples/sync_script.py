"""A synchronous script: trollout.sync, no event loop of your own, any thread.

Runs one batch to its end, then a second one read outcome by outcome and closed early; prints
what it got. The collector (and its connections) is shared by both batches.

    python examples/sync_script.py
"""

from __future__ import annotations

import argparse
import contextlib
from collections import Counter
from collections.abc import Iterator

import trollout
from trollout.testing import AgentSpec, DeploymentSpec, spawn_fake_deployment, task_rows


def run(urls: dict[str, str], prompts: int) -> None:
    """Two batches on one blocking Rollouts."""
    config = trollout.RunConfig(agent_name="math_agent", num_repeats=2)
    with trollout.sync.open_rollouts(urls, config=config) as ro:
        outcomes = ro.run_batch(ro.plan(list(task_rows(prompts, seed=1))))
        kinds = Counter(type(item.outcome).__name__ for item in outcomes)
        mean = sum(item.reward or 0.0 for item in outcomes) / len(outcomes)
        print(f"batch 1: {dict(kinds)}, mean reward {mean:.3f}")
        with ro.open_batch(ro.plan(list(task_rows(prompts, seed=2)))) as batch:
            first = next(batch)  # blocks until the first rollout settles
            rest = batch.close_and_drain()  # cancel what is still running, keep what settled
        print(f"batch 2: first was task {first.row['_ng_task_index']}, {len(rest)} more kept")


@contextlib.contextmanager
def deployment(agent_urls: list[str]) -> Iterator[dict[str, str]]:
    """The agents to use: the ones given, else the bundled fake in a subprocess."""
    if agent_urls:
        yield dict(item.split("=", 1) for item in agent_urls)
        return
    with spawn_fake_deployment(DeploymentSpec(agents=(AgentSpec(name="math_agent"),))) as fake:
        yield fake.run_urls


def main() -> None:
    """Parse the command line and run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent-url", action="append", default=[], metavar="NAME=URL")
    parser.add_argument("--prompts", type=int, default=8)
    args = parser.parse_args()
    with deployment(args.agent_url) as urls:
        run(urls, args.prompts)


if __name__ == "__main__":
    main()
