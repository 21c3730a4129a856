"""Mergeable per-task state: the metric columns of every rollout, kept per (group, task).

A row's *metric columns* follow NeMo Gym's default metrics: every top-level number (booleans as
0/1) and every number of ``response.usage`` (usage wins on a clash), except keys starting with
``_`` and ``mask_sample``, and except a value that is not a finite float (NaN, inf, an int past
the float range: JSON cannot hold one, and writes NaN and inf as null). A row whose
``mask_sample`` is truthy is counted but left out of every statistic, as NeMo Gym does.

State: one `TaskStats` per (group, task) holding the task's rollouts as bitmasks (landed, known)
and their column values. The values are what an exact median needs; every other statistic
(count, sum, sum of squares, min, max, rewards correct) is derived from them when the run is
summarized. The state is a multiset, so merging two states is exact and order-free, and a
statistic of merged per-shard states equals the statistic of the union, bit for bit.

Memory follows tasks and their k repeats, never row payloads: a task's values live in one
``array('d')`` laid out row by row under a *schema* (the task's column names, one interned tuple
shared by every task with the same columns); a column absent from a row is NaN (JSON numbers are
never NaN). With 6 columns and 4 repeats a task costs about 400 bytes.

Design note: the rejected alternative kept streaming moments (count, Welford mean and M2, min,
max) per task and per group. They are O(1), but floating-point merges depend on the order and
split, so per-shard results would not equal the union's, and an exact median needs the values
anyway. Keeping the few values per task gives exact, split-independent results.
"""

from __future__ import annotations

import math
import sys
from array import array
from collections.abc import Iterator, Mapping
from typing import Any, Final

__all__ = ["MASK_SAMPLE", "GroupStats", "TaskStats", "is_masked", "metric_columns", "popcount"]

MASK_SAMPLE: Final = "mask_sample"
_NAN: Final = math.nan
_MAX: Final = sys.float_info.max
_NUMBER_TYPES: Final = frozenset({int, float, bool})  # exact types: subclasses are not numbers


def metric_columns(row: Mapping[str, Any]) -> dict[str, float]:
    """Return a row's metric columns in NeMo Gym's order (row keys, then usage keys)."""
    response = row.get("response")
    usage = response.get("usage") if isinstance(response, Mapping) else None
    if isinstance(usage, Mapping) and usage:
        if any(key in row for key in usage):  # a clash: usage's value at the row key's place
            return _numbers({**row, **usage})
        return _numbers(row) | _numbers(usage)
    return _numbers(row)


def _numbers(mapping: Mapping[str, Any]) -> dict[str, float]:
    # A number past the float range, an inf or a NaN (from an embedding driver; JSON holds
    # none, and writes them as null) is not a number here either: the row lacks that column.
    return {
        k: float(v)
        for k, v in mapping.items()
        if type(v) in _NUMBER_TYPES and k[:1] != "_" and k != MASK_SAMPLE and -_MAX <= v <= _MAX
    }


def is_masked(row: Mapping[str, Any]) -> bool:
    """Whether NeMo Gym leaves this row out of every statistic (``mask_sample`` truthy)."""
    return bool(row.get(MASK_SAMPLE))


def popcount(mask: int) -> int:
    """Return the number of rollouts in a rollout bitmask."""
    return mask.bit_count()


class TaskStats:
    """The rollouts of one task in one group: bitmasks, masked count, column values.

    Attributes:
        landed: bitmask of rollout indices with a row (bit r for rollout r).
        known: bitmask of rollout indices the run planned or saw (materialized, landed, failed).
        masked: rows left out of the statistics by ``mask_sample``.
        rows: rows whose columns are kept (not masked).
        schema: column names of `data`, one interned tuple.
        data: the kept rows' values, row by row: the columns under `schema` (NaN where a row
            lacks one), then the row's rollout index (-1: not known), for ``rollout_infos``.
    """

    __slots__ = ("data", "known", "landed", "masked", "ragged", "rows", "schema")

    def __init__(self) -> None:
        self.landed = 0
        self.known = 0
        self.masked = 0
        self.rows = 0
        self.ragged = False  # some row lacks some column (NaN in data)
        self.schema: tuple[str, ...] = ()
        self.data = array("d")

    def add(self, columns: Mapping[str, float], schema: tuple[str, ...], rollout: int = -1) -> None:
        """Add one kept row; ``schema`` is ``tuple(columns)``, interned by the group."""
        self.rows += 1
        if schema is self.schema or schema == self.schema:
            self.data.extend(columns.values())
        else:
            self._widen(schema)
            if len(columns) < len(self.schema):
                self.ragged = True
            self.data.extend(columns.get(name, _NAN) for name in self.schema)
        self.data.append(rollout)

    def _widen(self, schema: tuple[str, ...]) -> None:
        """Extend the schema with new column names, padding earlier rows with NaN."""
        new = tuple(name for name in schema if name not in self.schema)
        if not new:
            return
        stride, old = len(self.schema) + 1, self.data
        self.ragged = self.ragged or self.rows > 1
        widened = self.schema + new
        self.schema = schema if widened == schema else widened  # keep the interned tuple
        padding = array("d", [_NAN] * len(new))
        self.data = array("d")
        for start in range(0, len(old), stride):
            self.data.extend(old[start : start + stride - 1])
            self.data.extend(padding)
            self.data.append(old[start + stride - 1])

    def _column(self, name: str) -> array[float] | None:
        try:
            index = self.schema.index(name)
        except ValueError:
            return None
        return self.data[index :: len(self.schema) + 1]

    def values(self, name: str) -> list[float]:
        """Return the values of one column over the kept rows (rows lacking it left out)."""
        column = self._column(name)
        if column is None:
            return []
        return [v for v in column if v == v] if self.ragged else column.tolist()

    def extend_column(self, name: str, out: array[float]) -> None:
        """Append one column's values to ``out`` (compact, no Python float per value)."""
        column = self._column(name)
        if column is not None:
            out.extend(array("d", (v for v in column if v == v)) if self.ragged else column)

    def rollouts(self) -> Iterator[tuple[int, dict[str, float]]]:
        """Yield ``(rollout index, columns)`` of the kept rows, in the order they were added."""
        stride = len(self.schema) + 1
        for start in range(0, len(self.data), stride):
            row = self.data[start : start + stride]
            columns = {n: v for n, v in zip(self.schema, row, strict=False) if v == v}
            yield int(row[-1]), columns

    def iter_rows(self) -> Iterator[dict[str, float]]:
        """Yield the kept rows' columns (a row without any column yields ``{}``)."""
        return (columns for _, columns in self.rollouts())

    def merge(self, other: TaskStats) -> None:
        """Add another state of the same task (multiset union; bitmasks OR-ed)."""
        self.landed |= other.landed
        self.known |= other.known
        self.masked += other.masked
        for rollout, row in other.rollouts():
            self.add(row, tuple(row), rollout)


class GroupStats:
    """The tasks of one metrics group (an agent, or an environment server without agent).

    Attributes:
        tasks: `TaskStats` by ``_ng_task_index``.
        schemas: every distinct column tuple, mapped to the smallest (task, rollout) that had
            it; this interns schemas and orders the columns as NeMo Gym's table would be
            ordered on rows sorted by (task, rollout).
        rollout_indices: bitmask of every rollout index with a row (``num_repeats``).
        environment_servers: the ``_ng_environment_server`` values seen, in order.
    """

    def __init__(self) -> None:
        self.tasks: dict[int, TaskStats] = {}
        self.schemas: dict[tuple[str, ...], tuple[int, int]] = {}
        self._interned: dict[tuple[str, ...], tuple[str, ...]] = {}
        self.rollout_indices = 0
        self.environment_servers: dict[str, None] = {}

    def task(self, task_index: int) -> TaskStats:
        """Return the state of a task, created empty on first use."""
        state = self.tasks.get(task_index)
        if state is None:
            state = self.tasks[task_index] = TaskStats()
        return state

    def add_row(
        self, task_index: int, rollout_index: int, columns: Mapping[str, float], *, masked: bool
    ) -> None:
        """Record one row of the metric input (the caller has already de-duplicated it)."""
        state = self.task(task_index)
        bit = 1 << rollout_index
        state.landed |= bit
        state.known |= bit
        self.rollout_indices |= bit
        if masked:
            state.masked += 1
            return
        schema = self._intern(tuple(columns), (task_index, rollout_index))
        state.add(columns, schema, rollout_index)

    def _intern(self, schema: tuple[str, ...], at: tuple[int, int]) -> tuple[str, ...]:
        interned = self._interned.setdefault(schema, schema)
        first = self.schemas.get(interned)
        if first is None or at < first:
            self.schemas[interned] = at
        return interned

    def column_order(self, *others: GroupStats) -> list[str]:
        """Return column names in order of first appearance on rows sorted by (task, rollout)."""
        schemas = [item for g in (self, *others) for item in g.schemas.items()]
        order: dict[str, None] = {}
        for schema, _ in sorted(schemas, key=lambda item: item[1]):
            order.update(dict.fromkeys(schema))
        return list(order)

    def merge(self, other: GroupStats) -> None:
        """Add another group state (per-task multiset union)."""
        for task_index, state in other.tasks.items():
            self.task(task_index).merge(state)
        for schema, at in other.schemas.items():
            self._intern(schema, at)
        self.rollout_indices |= other.rollout_indices
        self.environment_servers.update(other.environment_servers)
