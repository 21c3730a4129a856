"""NeMo Gym's default ``/aggregate_metrics``, computed locally from the per-task state.

For one group (agent or environment server) over the metric input (landed rows plus imputed
zeros), following NeMo Gym 0.7.0's defaults so the numbers match a default server:

- columns: `stats.metric_columns`; rows with a truthy ``mask_sample`` are left out of every
  statistic, and when any are, ``coverage/measured_rollouts``, ``coverage/masked_rollouts``,
  ``coverage/measured_tasks`` and ``coverage/fully_masked_tasks`` join ``agent_metrics`` and
  ``key_metrics``;
- statistics, stat-major (``mean/*``, ``max/*``, ``min/*``, ``median/*``, ``std/*``): the std is
  the sample one; a std that cannot be computed (one value) is left out, unless no std of the
  group can be, in which case the columns present in every row get 0.0 (pandas' behaviour);
- ``agent_metrics`` ends with ``num_repeats``, the number of distinct rollout indices;
  ``key_metrics`` are its ``mean/*`` entries;
- ``group_level_metrics``: one entry per task (sorted) with the same statistics, plus
  ``num_rollouts`` (rows measured), ``expected_num_rollouts`` (rollouts planned),
  ``missing_num_rollouts`` (planned without a row in the metric input) and
  ``reward_profile_completion_pct``, then ``rollout_infos`` (each rollout's numbers, as NeMo
  Gym lists them, every number as a float). NeMo Gym's ``sample`` is not written:
  it copies a row's payload into the file, and memory must follow tasks.

Entries are generated one task at a time, so a writer can stream them.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

from .estimators import ColumnStats, describe
from .stats import GroupStats, TaskStats, popcount
from .streaming import Chunks, describe_chunks

__all__ = [
    "agent_metrics",
    "column_chunks",
    "describe_columns",
    "group_level_metrics",
    "key_metrics",
]

STATS: Final = ("mean", "max", "min", "median", "std")


def describe_columns(
    columns: Sequence[str], stats_of: Callable[[str], ColumnStats | None], rows: int
) -> dict[str, float]:
    """Return ``{stat/column: value}`` over ``rows`` rows, stat-major, with pandas' std rule."""
    stats: dict[str, ColumnStats] = {}
    for column in columns:
        found = stats_of(column)
        if found is not None:
            stats[column] = found
    stds = {c: s.std for c, s in stats.items()}
    if all(v is None for v in stds.values()):
        stds = {c: 0.0 if s.size == rows else None for c, s in stats.items()}
    names = [(_names(c), (s.mean, s.max, s.min, s.median)) for c, s in stats.items()]
    out: dict[str, float] = {}
    for i in range(4):  # stat-major: every mean, then every max, ...
        for keys, values in names:
            out[keys[i]] = values[i]
    for keys, _ in names:
        std = stds[keys[5]]
        if std is not None:
            out[keys[4]] = std
    return out


_NAMES: dict[str, tuple[str, ...]] = {}


def _names(column: str) -> tuple[str, ...]:
    """Return ``mean/c``, ``max/c``, ``min/c``, ``median/c``, ``std/c`` and ``c`` (cached)."""
    names = _NAMES.get(column)
    if names is None:
        names = _NAMES[column] = (*(f"{stat}/{column}" for stat in STATS), column)
    return names


_CHUNK = 1 << 16


def column_chunks(parts: Sequence[GroupStats], column: str) -> Chunks:
    """Return a factory of one column's values over group states, in slices of 64k values.

    The column is copied once into a compact ``array('d')`` (8 bytes a value, like the
    per-task state it comes from), so each pass over it runs at C speed on large slices.
    """
    values: array[float] = array("d")
    for part in parts:
        for state in part.tasks.values():
            state.extend_column(column, values)

    def chunks() -> Iterator[array[float]]:
        for start in range(0, len(values), _CHUNK):
            yield values[start : start + _CHUNK]

    return chunks


def _parts(landed: GroupStats, imputed: GroupStats | None) -> list[GroupStats]:
    return [landed] if imputed is None else [landed, imputed]


def _coverage_keys(parts: Sequence[GroupStats]) -> dict[str, int]:
    rows: dict[int, int] = {}
    masked = 0
    for part in parts:
        for task, state in part.tasks.items():
            if state.rows or state.masked:
                rows[task] = rows.get(task, 0) + state.rows
                masked += state.masked
    if not masked:
        return {}
    measured = sum(rows.values())
    return {
        "coverage/measured_rollouts": measured,
        "coverage/masked_rollouts": masked,
        "coverage/measured_tasks": sum(1 for n in rows.values() if n),
        "coverage/fully_masked_tasks": sum(1 for n in rows.values() if not n),
    }


def agent_metrics(landed: GroupStats, imputed: GroupStats | None = None) -> dict[str, Any]:
    """Return the group's ``agent_metrics`` over landed rows plus imputed rows."""
    parts = _parts(landed, imputed)
    rows = sum(s.rows for p in parts for s in p.tasks.values())
    coverage = _coverage_keys(parts)
    if not rows:
        return dict(coverage)
    columns = landed.column_order(*parts[1:])

    def stats_of(column: str) -> ColumnStats | None:
        return describe_chunks(column_chunks(parts, column))

    metrics: dict[str, Any] = describe_columns(columns, stats_of, rows) | coverage
    rollout_indices = 0
    for part in parts:
        rollout_indices |= part.rollout_indices
    metrics["num_repeats"] = popcount(rollout_indices)
    return metrics


def key_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """Return the ``mean/*`` entries (and coverage counts) of ``agent_metrics``."""
    return {k: v for k, v in metrics.items() if k.startswith(("mean/", "coverage/"))}


def group_level_metrics(
    landed: GroupStats, imputed: GroupStats | None = None
) -> Iterator[dict[str, Any]]:
    """Yield one ``group_level_metrics`` entry per task with measured rows, by task index."""
    parts = _parts(landed, imputed)
    columns = landed.column_order(*parts[1:])
    tasks = sorted({t for p in parts for t in p.tasks})
    for task in tasks:
        states = [p.tasks[task] for p in parts if task in p.tasks]
        entry = _task_entry(task, states, columns)
        if entry is not None:
            yield entry


def _task_entry(
    task: int, states: list[TaskStats], columns: Sequence[str]
) -> dict[str, Any] | None:
    rows = sum(s.rows for s in states)
    if not rows:
        return None
    present = set().union(*(s.schema for s in states))
    mine = [c for c in columns if c in present]

    def stats_of(column: str) -> ColumnStats | None:
        values = [v for s in states for v in s.values(column)]
        return describe(values) if values else None

    landed = known = 0
    for s in states:
        landed |= s.landed
        known |= s.known
    expected = popcount(known | landed)
    missing = expected - popcount(landed)
    entry: dict[str, Any] = {"_ng_task_index": task}
    entry.update(describe_columns(mine, stats_of, rows))
    entry["num_rollouts"] = rows
    entry["expected_num_rollouts"] = expected
    entry["missing_num_rollouts"] = missing
    entry["reward_profile_completion_pct"] = 100.0 * (expected - missing) / expected
    entry["rollout_infos"] = _rollout_infos(task, states)
    return entry


def _rollout_infos(task: int, states: Sequence[TaskStats]) -> list[dict[str, Any]]:
    """Return NeMo Gym's per-rollout numbers of a task, by rollout index."""
    rows = sorted(
        ((rollout, columns) for state in states for rollout, columns in state.rollouts()),
        key=lambda item: item[0],
    )
    return [
        {
            "rollout_id": f"{task}:{rollout}",
            "_ng_task_index": task,
            "_ng_rollout_index": rollout,
            **columns,
        }
        for rollout, columns in rows
    ]
