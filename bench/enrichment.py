"""Enrichment's added CPU per rollout (~2 model calls each): on vs off, side by side, one run.

Each rollout's capture file holds two calls shaped like NeMo Gym's healthy run (a tool call,
then the answer; full request/response bodies). The same landed outcomes go through the
collector's `Enricher` with observability on (read in a worker thread, merged, projected,
ng_perf) and through the one a run with observability off installs (a dict lookup), in
alternating rounds; CPU time is the process's (threads included).

    .venv/bin/python bench/enrichment.py [ROLLOUTS]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import trio

from trollout.enrichment import Enricher, EnrichmentOptions
from trollout.records import Identity, Landed
from trollout.testing.capture import capture_rollout
from trollout.testing.policy import MODEL_ID, answer_row, build_response


def _outcomes(capture_dir: str, n: int) -> list[Landed]:
    outcomes = []
    for task in range(n):
        row = {
            "_ng_task_index": task,
            "_ng_rollout_index": 0,
            "responses_create_params": {
                "input": [{"role": "user", "content": f"What is {task} + 2?"}]
            },
        }
        answer = answer_row(row, agent="a", accuracy=0.8, policy_seed=1)
        response = build_response(row, answer, model=MODEL_ID)
        trajectory = capture_rollout(capture_dir, row, response, "policy_model")
        result = {"response": response, "reward": answer.reward, "ng_trajectory": trajectory}
        outcomes.append(Landed(Identity(task, 0, "a"), 0, result, 0.05))
    return outcomes


async def _run(enricher: Enricher, outcomes: list[Landed]) -> float:
    start = time.process_time()
    for outcome in outcomes:
        await enricher(outcome)
    return time.process_time() - start


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    with tempfile.TemporaryDirectory() as capture_dir:
        outcomes = _outcomes(capture_dir, n)
        size = sum(os.path.getsize(os.path.join(capture_dir, f)) for f in os.listdir(capture_dir))
        on = Enricher(EnrichmentOptions(observability=True, capture_dir=capture_dir))
        off = Enricher(EnrichmentOptions())
        plain = [
            Landed(o.identity, 0, {k: v for k, v in o.result.items() if k != "ng_trajectory"}, 0.05)
            for o in outcomes
        ]
        figures: dict[str, list[float]] = {
            "on": [],
            "off (agent trajectory projected)": [],
            "off (no trajectory)": [],
        }
        for _ in range(3):  # alternating rounds: the machine's noise hits both sides alike
            figures["on"].append(trio.run(_run, on, outcomes))
            figures["off (agent trajectory projected)"].append(trio.run(_run, off, outcomes))
            figures["off (no trajectory)"].append(trio.run(_run, off, plain))
    print(
        f"enrichment CPU per rollout, {n} rollouts x 2 model calls "
        f"({size / n / 1024:.1f} KiB of capture each), best of 3:"
    )
    base = min(figures["off (no trajectory)"]) / n
    for name, times in figures.items():
        per = min(times) / n
        print(f"  {name:36s} {per * 1e6:8.1f} us/rollout  (+{(per - base) * 1e6:.1f} us over off)")


if __name__ == "__main__":
    main()
