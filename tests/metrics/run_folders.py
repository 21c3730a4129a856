"""Builders of run folders (rollouts, failures sidecar, materialized inputs) for metrics tests."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from builders import identity, write_jsonl
from trollout.records import (
    Failed,
    Landed,
    MaterializedRow,
    OmitReason,
    Omitted,
    converter,
    outcome_to_row,
)
from trollout.recovery.layout import RunLayout

Row = dict[str, Any]


def landed(
    task: int,
    rollout: int,
    reward: float | None = 1.0,
    *,
    agent: str | None = "agent_a",
    env: str | None = None,
    tokens: tuple[int, int] = (100, 20),
    elapsed: float | None = 1.5,
    attempt: int = 0,
    **extra: Any,
) -> Row:
    """Return a success row as a collector writes it."""
    usage = {"input_tokens": tokens[0], "output_tokens": tokens[1], "total_tokens": sum(tokens)}
    result: Row = {
        "responses_create_params": {"input": [{"role": "user", "content": f"task {task}"}]},
        "response": {"id": f"resp-{task}-{rollout}", "output": [], "usage": usage},
        **({"reward": reward} if reward is not None else {}),
        **extra,
    }
    return outcome_to_row(
        Landed(identity(task, rollout, agent=agent, env=env), attempt, result, elapsed)
    )


def failed(
    task: int,
    rollout: int,
    failure_class: str = "agent_run_error",
    *,
    attempt: int = 0,
    agent: str | None = "agent_a",
    env: str | None = None,
    **extra: Any,
) -> Row:
    """Return a failures-sidecar row."""
    outcome = Failed(
        identity(task, rollout, agent=agent, env=env), attempt, failure_class, extra=extra
    )
    return outcome_to_row(outcome)


def omitted(
    task: int,
    rollout: int,
    *,
    attempt: int,
    drained: bool = False,
    agent: str | None = "agent_a",
) -> Row:
    """Return an ``_ng_omitted_rollout`` row (interrupted, or drained when ``drained``)."""
    reason = OmitReason.DRAINED if drained else OmitReason.INTERRUPTED
    return outcome_to_row(Omitted(identity(task, rollout, agent=agent), attempt, reason))


def planned(task: int, rollout: int, *, agent: str | None = "agent_a", **fields: Any) -> Row:
    """Return a materialized-inputs row (each task its own question, as in a real dataset)."""
    body = {
        "responses_create_params": {"input": f"q{task}"},
        **fields,
        **identity(task, rollout, agent=agent).stamps(),
    }
    return converter.unstructure(MaterializedRow.from_body(body))  # type: ignore[no-any-return]


def write_run(
    output: Path,
    rows: Iterable[Row] = (),
    *,
    failures: Iterable[Row] | None = None,
    plan: Iterable[Row] | None = None,
) -> RunLayout:
    """Write a run folder whose rollouts file is ``output``; return its layout."""
    layout = RunLayout.for_output(output)
    write_jsonl(layout.rollouts, rows)
    if failures is not None:
        write_jsonl(layout.failures, failures)
    if plan is not None:
        write_jsonl(layout.materialized_inputs, plan)
    return layout


def plan_for(tasks: int, repeats: int, agent: str = "agent_a") -> list[Row]:
    """Return the materialized rows of ``tasks`` tasks with ``repeats`` rollouts each."""
    return [planned(t, r, agent=agent) for t in range(tasks) for r in range(repeats)]


def read_metrics(layout: RunLayout) -> list[dict[str, Any]]:
    """Return the parsed ``<stem>_aggregate_metrics.json``."""
    data: list[dict[str, Any]] = orjson.loads(layout.aggregate_metrics.read_bytes())
    return data
