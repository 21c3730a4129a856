"""The public surface: everything in __all__ exists and the embedding path works."""

from __future__ import annotations

from typing import Any

import trollout
from trollout.testing import open_fake_deployment


def test_public_api_exports_exist() -> None:
    """Every name in trollout.__all__ is importable from the package."""
    missing = [name for name in trollout.__all__ if not hasattr(trollout, name)]
    assert missing == []


async def test_public_api_embedding_driver_collects_over_loopback(tmp_path: Any) -> None:
    """A driver plans rows in memory and collects them with the public API alone."""
    rows = [
        {
            "responses_create_params": {"input": [{"role": "user", "content": "What is 2 + 3?"}]},
            "expected_answer": "5",
        },
    ]
    async with open_fake_deployment() as fake:
        urls = dict(fake.agent_urls.items())
        deployment = trollout.Deployment.from_agent_urls(urls)
        config = trollout.RunConfig(agent_name="math_agent", num_repeats=3)
        plan = trollout.plan_rows(rows, config, deployment)
        async with trollout.open_collector(
            config=config, urls=urls, retain_outcomes=True
        ) as collector:
            await collector.collect(plan.rows())
            outcomes = collector.drain_nowait()
    assert plan.expected == 3
    assert sorted(o.identity.rollout_index for o in outcomes) == [0, 1, 2]
    assert all(isinstance(o, trollout.Landed) for o in outcomes)
