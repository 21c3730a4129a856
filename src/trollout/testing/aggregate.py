"""NeMo Gym's default ``/aggregate_metrics``, written plainly for the fake deployment.

This is a reference implementation for tests: simple, in memory, with the ``statistics``
module, and on purpose sharing no code with `trollout.metrics` (a test compares the two).
It follows NeMo Gym 0.7.0's ``compute_aggregate_metrics`` with default settings:

- rows with a truthy ``mask_sample`` are left out of every statistic; when any are, the
  ``coverage/*`` counts join ``agent_metrics`` and ``key_metrics``;
- the columns are every top-level number of a row (booleans as 0/1; keys starting with ``_``
  and ``mask_sample`` excluded) and the numbers of ``response.usage``, which win on a clash;
- each column gets ``mean/ max/ min/ median/ std/``, std being the *sample* standard deviation
  (n - 1; NeMo Gym uses pandas' default, and the reference file's 4.442 for
  [358, 357, 355, 357, 367, 358, 357, 355, 357, 367] confirms it). A std that cannot be
  computed (one value) is left out, unless *no* std of the group can be, in which case the
  columns present in every row of the group get 0.0;
- ``group_level_metrics`` has one entry per ``_ng_task_index`` (sorted), with NeMo Gym's
  bookkeeping keys (``sample``, ``num_rollouts``, ``rollout_infos``, ...);
- ``key_metrics`` are the ``mean/*`` entries of ``agent_metrics``; ``num_repeats`` counts the
  distinct rollout indices.

Left out: NeMo Gym's repeat-level statistics (``repeat_level_metrics`` entries and the
``*_across_repeats/*`` keys it adds when a task has several rollouts; they need Student-t
intervals) and ``perf_summary`` (always null here).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["aggregate_metrics"]

TASK = "_ng_task_index"
ROLLOUT = "_ng_rollout_index"
_STATS = ("mean", "max", "min", "median", "std")


def _number(value: Any) -> int | float | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return value
    return None


def _usage(row: Mapping[str, Any]) -> Mapping[str, Any]:
    response = row.get("response") or {}
    return (response.get("usage") if isinstance(response, Mapping) else None) or {}


def _columns(row: Mapping[str, Any]) -> dict[str, int | float]:
    """Return a row's metric columns in NeMo Gym's order (row keys, then usage keys)."""
    merged = {k: v for k, v in row.items() if k != "mask_sample"} | dict(_usage(row))
    numbers = {k: _number(v) for k, v in merged.items() if not k.startswith("_")}
    return {k: v for k, v in numbers.items() if v is not None}


def _or_inf(statistic: Callable[[list[Any]], float], values: list[Any]) -> float:
    """Return the statistic, or inf where the sums overflow (pandas' result; JSON null)."""
    try:
        return statistic(values)
    except OverflowError:
        return math.inf


def _describe(records: Sequence[Mapping[str, int | float]]) -> dict[str, float]:
    """Return ``{stat/column: value}`` over ``records``, stat-major like pandas' stack."""
    order: dict[str, None] = {}
    for record in records:
        order.update(dict.fromkeys(record))
    values = {c: [r[c] for r in records if c in r] for c in order}
    stds = {c: _or_inf(statistics.stdev, v) if len(v) > 1 else math.nan for c, v in values.items()}
    if all(math.isnan(s) for s in stds.values()):
        stds = {c: 0.0 if len(values[c]) == len(records) else s for c, s in stds.items()}
    table = {
        "mean": {c: _or_inf(statistics.fmean, v) for c, v in values.items()},
        "max": {c: float(max(v)) for c, v in values.items()},
        "min": {c: float(min(v)) for c, v in values.items()},
        "median": {c: float(statistics.median(v)) for c, v in values.items()},
        "std": stds,
    }
    return {
        f"{stat}/{c}": table[stat][c]
        for stat in _STATS
        for c in order
        if not math.isnan(table[stat][c])
    }


def _rollout_info(row: Mapping[str, Any]) -> dict[str, Any]:
    task, rollout = row.get(TASK, 0), row.get(ROLLOUT, 0)
    info: dict[str, Any] = {"rollout_id": f"{task}:{rollout}", TASK: task, ROLLOUT: rollout}
    if "reward" in row:
        info["reward"] = row["reward"]
    for k, v in _usage(row).items():
        if (n := _number(v)) is not None:
            info[k] = n
    for k, v in row.items():
        if k.startswith("_") or k in ("reward", "response", "mask_sample"):
            continue
        if (n := _number(v)) is not None:
            info[k] = n
    return info


def _group(task: Any, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    infos = sorted((_rollout_info(r) for r in rows), key=lambda i: i[ROLLOUT])
    return {
        TASK: task,
        **_describe([_columns(r) for r in rows]),
        "sample": {"agent_ref": {"name": "agent"}},
        "num_rollouts": len(rows),
        "expected_num_rollouts": len(rows),
        "missing_num_rollouts": 0,
        "reward_profile_completion_pct": 100.0,
        "rollout_infos": infos,
    }


def _coverage(
    rows: Sequence[Mapping[str, Any]], scored: Sequence[Mapping[str, Any]]
) -> dict[str, int]:
    if len(scored) == len(rows):
        return {}
    tasks = {r.get(TASK, 0) for r in rows}
    measured = {r.get(TASK, 0) for r in scored}
    return {
        "coverage/measured_rollouts": len(scored),
        "coverage/masked_rollouts": len(rows) - len(scored),
        "coverage/measured_tasks": len(measured),
        "coverage/fully_masked_tasks": len(tasks - measured),
    }


def _check_unique(rows: Sequence[Mapping[str, Any]]) -> None:
    seen: set[tuple[Any, Any]] = set()
    for row in rows:
        key = (row.get(TASK, 0), row.get(ROLLOUT, 0))
        if key in seen:
            raise ValueError(f"Duplicate result row for rollout key {key}")
        seen.add(key)


def _reply(
    groups: list[dict[str, Any]], agent: dict[str, Any], key: dict[str, Any]
) -> dict[str, Any]:
    return {
        "group_level_metrics": groups,
        "agent_metrics": agent,
        "key_metrics": key,
        "perf_summary": None,
        "repeat_level_metrics": [],
    }


def aggregate_metrics(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Return NeMo Gym's default ``/aggregate_metrics`` reply for ``verify_responses`` rows.

    Raises:
        ValueError: two rows share a (task, rollout) key (NeMo Gym answers 500).
    """
    if not rows:
        return _reply([], {}, {})
    scored = [r for r in rows if not r.get("mask_sample")]
    coverage = _coverage(rows, scored)
    if not scored:
        return _reply([], dict(coverage), dict(coverage))
    _check_unique(scored)
    by_task: defaultdict[Any, list[Mapping[str, Any]]] = defaultdict(list)
    for row in scored:
        by_task[row.get(TASK, 0)].append(row)
    groups = [_group(task, by_task[task]) for task in sorted(by_task)]
    agent = _describe([_columns(r) for r in scored]) | coverage
    agent["num_repeats"] = len({r.get(ROLLOUT, 0) for r in rows})
    key = {k: v for k, v in agent.items() if k.startswith("mean/")} | coverage
    return _reply(groups, agent, key)
