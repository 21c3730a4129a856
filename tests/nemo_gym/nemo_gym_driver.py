"""A driver written against NeMo Gym 0.7.0's direct collection API, as a trainer would write it.

Only its imports name trollout (the line marked below); everything else is NeMo Gym's API:
`preprocess_examples` with ``agent_map`` and ``num_repeats``, `run_examples` iterated and cut
with ``aclose()``, ``aclose_and_drain()``, `run_outcomes` with a ``run_id``, and a step
recorded as a shard (``record_output_dir`` + ``record_shard``). It returns what it saw, for the
test that runs it (tests/nemo_gym/test_acceptance.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from trollout.nemo_gym import (
    BaseServerConfig,
    RolloutCollectionHelper,
)  # was: nemo_gym.rollouts.rollout_collection


async def drive(
    examples: list[dict[str, Any]], host: str, port: int, record_output_dir: str
) -> dict[str, Any]:
    """Run four steps against the head server at host:port; return what each step saw."""
    head = BaseServerConfig(host=host, port=port)
    helper = RolloutCollectionHelper(reuse_server_client=True)
    rows = helper.preprocess_examples(
        examples, agent_map={"dataset_agent": "math_agent"}, num_repeats=2
    )
    seen: dict[str, Any] = {"rows": rows}

    # Step 1: take two rollouts, then stop; aclose cancels what is still running.
    taken = []
    completions = helper.run_examples(rows, head_server_config=head)
    try:
        for future in completions:
            row, result = await future
            taken.append((row, result))
            if len(taken) == 2:
                break
    finally:
        await completions.aclose()
    seen["cut"] = taken

    # Step 2: take one, then keep what else finished.
    completions = helper.run_examples(rows, head_server_config=head, semaphore=asyncio.Semaphore(4))
    first = await next(iter(completions))
    drained = await completions.aclose_and_drain()
    kept = []
    for future in drained:
        with contextlib.suppress(asyncio.CancelledError):
            kept.append(await future)
    seen["drain"] = {"first": first, "kept": kept, "again": await completions.aclose_and_drain()}

    # Step 3: typed outcomes under a run id of the caller's.
    outcomes = helper.run_outcomes(rows[:4], head_server_config=head, run_id="step-3")
    seen["outcomes"] = [await future for future in outcomes]

    # Step 4: record the step as a shard, stop after the rollouts that finish.
    recorded = []
    completions = helper.run_examples(
        rows,
        head_server_config=head,
        record_output_dir=record_output_dir,
        record_shard="step-4",
        route_failures_to_sidecar=True,
    )
    try:
        for future in completions:
            recorded.append(await future)
            if len(recorded) == 4:
                break
    finally:
        await completions.aclose()
    seen["recorded"] = recorded
    return seen
