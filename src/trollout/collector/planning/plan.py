"""Preprocessing: input rows to materialized rows, streaming (docs/protocol.md section 5).

`plan_rollouts` (a JSONL file) and `plan_rows` (in-memory rows, for embedding drivers) check the
whole input and return a `Plan`: ``tasks``, ``expected`` rollouts, and ``rows()``, a re-iterable
stream of `MaterializedRow` records in dispatch order (``bodies()``: the same rows' bodies alone,
what the materialized-inputs file holds, with no identity built). The rules live in helpers:
`input_file` (reading, row checks, task identity, `limit`/`task_ids`/`shard`), `routing`
(agents, fan-out, environment servers, repeats) over the `router.Router` protocol, and `seeds`
(stale keys, overrides, seeds, stamps).

Passes. Planning reads the input once or twice: pass 1 checks every row (rows that `limit` or
`task_ids` will drop included, so a broken file never half-runs), records task identity and
counts rollouts, and every problem (bad lines, rows nested deeper than a run can write, unknown
or refused agents, missing routes, bad settings) is raised together as one `InputError` before
anything can be dispatched; only when `limit`, `task_ids` or `shard` drop tasks does pass 2 walk
the kept rows to count their rollouts and find the round-robin groups. A plan
with no rollout (an empty input, ``limit`` 0, a ``task_ids`` that keeps nothing) is an
`InputError` too: a run that would do nothing is a mistake, not a success. The exception is a
``shard`` that keeps none of the tasks the rest of the plan keeps (more shards than tasks, or an
unlucky hash): that shard of the plan is empty, and its run is empty and complete. Each
``rows()`` call reads the input again:

- default ("aabbcc": every rollout of a row, then the next row): one pass;
- ``interleave_repeats`` ("abcabc": repeat 0 of every row, then repeat 1, ...): one pass per
  round, as many rounds as the largest ``num_repeats``;
- ``round_robin_agents``: one reader per group, a group being an (agent, environment server)
  pair in order of first appearance, each reader keeping only its group's rollouts (each reader
  follows the order above); the merge takes one rollout from each group in turn.

Numbering. Task and rollout indices and seeds are fixed by the walk in file order, whatever the
dispatch order, so every ordering is a permutation of the same rows. Rollout indices count per
task: lines of a task in file order, within a line its agents in fan-out order, within an agent
its repeats (fan-out ``{x: [a, b]}`` with 2 repeats: a gets 0, 1; b gets 2, 3).

Memory follows tasks, not rows: the task table (a 16-byte digest per distinct unstamped row,
the set of stamped indices, the set of tasks found on more than one line), the kept tasks under
`limit`/`task_ids`, a rollout counter per multi-line task during a pass, and one parsed row per
open reader.

Design note: the rejected alternative materialized every row in memory (or a temporary file)
and sorted it. It is simpler, but memory grows with rows times repeats (100,000 long prompts
times 16 repeats is gigabytes), and a temporary file doubles the disk writes the store already
makes for the materialized-inputs file. Re-reading costs one parse per line per pass, which is
small next to a rollout.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Generator, Iterator, Mapping, Sequence
from contextlib import closing
from typing import Any, NamedTuple

import attrs
from attrs import frozen

from ... import jsonl
from ...errors import ConfigError, InputError
from ...records import MaterializedRow
from ...settings import RunConfig, parse_shard
from .input_file import (
    FileSource,
    Problems,
    RowsSource,
    check_row,
    check_write_back,
)
from .router import Router
from .routing import Copy, Resolver
from .seeds import Materializer, Prepared, rollout_seed
from .tasks import Selection, TaskTable

__all__ = ["Plan", "Router", "plan_rollouts", "plan_rows", "rollout_seed"]

_Source = FileSource | RowsSource
_Group = tuple[str | None, str | None]
_Rows = Generator[MaterializedRow, None, None]
_Bodies = Generator[dict[str, Any], None, None]
_STAMP_BYTES = 128  # what materializing adds to a row, about: indices, agent_ref, seed


def plan_rollouts(input_path: str | os.PathLike[str], config: RunConfig, router: Router) -> Plan:
    """Check a JSONL input and plan its rollouts.

    Args:
        input_path: the input JSONL file; it is read again by every ``rows()`` pass and must
            not change meanwhile.
        config: the run's settings (the preprocessing group of `RunConfig`).
        router: the deployment, as `router.Router`.

    Raises:
        InputError: every problem of the input and the preprocessing settings, together; or
            the plan holds no rollout (the message says why).
    """
    source = FileSource(input_path, max_line_bytes=config.max_input_line_bytes)
    return _plan(source, config, router)


def plan_rows(
    rows: Sequence[Mapping[str, Any]],
    config: RunConfig,
    router: Router,
    *,
    start_task_index: int = 0,
) -> Plan:
    """Check in-memory rows and plan their rollouts (`plan_rollouts` for embedding drivers).

    The sequence is read again by every ``rows()`` pass and never mutated; problems name rows
    as ``rows[i]`` (0-based). Identical rows (equal as JSON with sorted keys) are one task.
    Tasks are numbered from ``start_task_index`` (a row carrying ``_ng_task_index`` keeps it),
    so rows planned apart, such as a training step's fresh tasks and the rollouts fed back from
    earlier steps, can go into one batch (docs/embedding.md).

    Raises:
        InputError: every problem of the rows and the preprocessing settings, together; or
            the plan holds no rollout (the message says why).
    """
    if type(start_task_index) is not int or start_task_index < 0:
        raise ConfigError(
            f"start_task_index must be a non-negative int (got {start_task_index!r}); it is "
            "the task index the rows' first task gets"
        )
    return _plan(RowsSource(rows), config, router, first_task=start_task_index)


class _Entry(NamedTuple):
    """A kept input row with its task, first rollout index, copies and size as read."""

    row: Mapping[str, Any]
    task: int
    base: int
    copies: tuple[Copy, ...]
    size: int


class _Walker:
    """Walks the kept rows in file order, numbering rollouts (one input pass per walk)."""

    def __init__(
        self, source: _Source, table: TaskTable, selection: Selection, resolver: Resolver
    ) -> None:
        self._source = source
        self._table = table
        self._selection = selection
        self._resolver = resolver

    def entries(self) -> Iterator[_Entry]:
        """Yield every kept row with its task and its first rollout index."""
        counters: dict[int, int] = {}  # next rollout index, for tasks on several lines only
        repeated = self._table.repeated
        for line in self._source.lines():
            row = line.row
            task = self._table.index_of(row, line.text) if row is not None else None
            if row is None or task is None:
                label = self._source.label(line.number)
                raise InputError([f"{label}: this row changed after planning; plan the run again"])
            if not self._selection.includes(task):
                continue
            copies = self._resolver.resolve(row).copies
            base = 0
            if task in repeated:
                if self._selection.each_once and task in counters:
                    continue
                base = counters.get(task, 0)
                counters[task] = base + sum(copy.repeats for copy in copies)
            yield _Entry(row, task, base, copies, len(line.text))


class _Orders:
    """Turns walks into the dispatch order the settings ask for (module docstring)."""

    def __init__(
        self,
        walker: _Walker,
        materializer: Materializer,
        *,
        rounds: int,
        groups: Sequence[_Group],
        interleave: bool,
        round_robin: bool,
    ) -> None:
        self._walker = walker
        self._materializer = materializer
        self._rounds = rounds
        self._groups = groups
        self._interleave = interleave
        self._round_robin = round_robin

    def bodies(self) -> _Bodies:
        """Return a fresh stream of every materialized row's body, in dispatch order."""
        if self._round_robin and len(self._groups) > 1:
            return self._round_robin_rows()
        return self._base(None)

    def _base(self, group: _Group | None) -> _Bodies:
        if self._interleave:
            return self._interleaved(group)
        return self._row_by_row(group)

    def _row_by_row(self, group: _Group | None) -> _Bodies:
        for entry in self._walker.entries():
            yield from self._emit(entry, group, None)

    def _interleaved(self, group: _Group | None) -> _Bodies:
        for round_ in range(self._rounds):
            for entry in self._walker.entries():
                yield from self._emit(entry, group, round_)

    def _emit(self, entry: _Entry, group: _Group | None, round_: int | None) -> _Bodies:
        """Yield an entry's rollouts (all, or only repeat ``round_``), of ``group`` or all."""
        prepared: Prepared | None = None
        start = entry.base
        for copy in entry.copies:
            wanted = group is None or copy.group == group
            if wanted and (round_ is None or round_ < copy.repeats):
                for j in range(copy.repeats) if round_ is None else (round_,):
                    if prepared is None:
                        prepared = self._materializer.prepare(entry.row)
                    yield self._materializer.make(prepared, entry.task, start + j, copy)
            start += copy.repeats

    def _round_robin_rows(self) -> _Bodies:
        streams = deque(self._base(group) for group in self._groups)
        try:
            while streams:
                stream = streams.popleft()
                row = next(stream, None)
                if row is not None:
                    streams.append(stream)  # before yielding, so closing us closes it too
                    yield row
        finally:
            for stream in streams:
                stream.close()


@frozen
class Plan:
    """The checked, numbered plan of a run; `rows` streams it as often as needed.

    Attributes:
        tasks: distinct tasks kept (after `limit` and `task_ids`).
        expected: materialized rollouts (every repeat of every kept row, every fan-out agent).
        materialized_bytes: an estimate of the materialized-inputs file's size (each kept
            row's size, as ``prompt_config`` expands it, times its rollouts, plus the stamps
            each rollout gets).
    """

    tasks: int
    expected: int
    materialized_bytes: int
    _orders: _Orders = attrs.field(alias="orders", repr=False, eq=False)

    def rows(self) -> _Rows:
        """Stream every materialized row in dispatch order (re-reads the input).

        Each call starts a fresh pass; close the generator to stop early (it closes the file).
        Reading is blocking file I/O: a Trio feeder should pull rows from a worker thread
        (``trio.to_thread.run_sync``) or in small batches. Each row's identity is read from its
        body (`MaterializedRow.from_body`), as from the materialized-inputs file.

        Raises:
            InputError: the input changed since it was planned.
        """
        with closing(self._orders.bodies()) as bodies:
            for body in bodies:
                yield MaterializedRow.from_body(body)

    def bodies(self) -> _Bodies:
        """Stream the bodies of `rows`, the rows as written to the materialized-inputs file.

        What writing that file needs, and cheaper than `rows`: no `Identity` is built. As
        `rows`: a fresh pass each call; close it to stop early.

        Raises:
            InputError: the input changed since it was planned.
        """
        return self._orders.bodies()


def _plan(source: _Source, config: RunConfig, router: Router, *, first_task: int = 0) -> Plan:
    problems = Problems()
    if jsonl.nested_deeper_than(config.responses_create_params, jsonl.MAX_DEPTH - 1):
        problems.config(
            f"responses_create_params nests deeper than {jsonl.MAX_DEPTH - 1} levels, so the "
            "rows it is merged into could not be written; flatten it"
        )
    resolver = Resolver(config, router, problems)
    materializer = Materializer(config)
    shard = parse_shard(config.shard) if config.shard is not None else None
    table = TaskTable(
        limit=config.limit, task_ids=config.task_ids, shard=shard, first_task=first_task
    )
    totals = _check_rows(source, resolver, materializer, table, problems)
    resolver.check_keys(problems)
    problems.raise_if_any()
    table.finish()
    selection = table.selection(config.task_ids, problems)
    problems.raise_if_any()
    walker = _Walker(source, table, selection, resolver)
    if selection.tasks is not None or selection.each_once:
        totals = _Totals()  # pass 2: only the kept rows count
        for entry in walker.entries():
            totals.add(entry.copies, materializer.expanded_bytes(entry.row, entry.size))
    expected, size, rounds, groups = totals.expected, totals.size, totals.rounds, totals.groups
    if expected > config.max_rollouts:
        raise ConfigError(
            f"the plan has {expected:,} rollouts, more than max_rollouts={config.max_rollouts:,}; "
            "pass --max-rollouts to allow a plan this large, or plan fewer rollouts "
            "(--limit, --num-repeats)"
        )
    orders = _Orders(
        walker,
        materializer,
        rounds=rounds,
        groups=groups,
        interleave=config.interleave_repeats,
        round_robin=config.round_robin_agents,
    )
    tasks = table.count if selection.tasks is None else len(selection.tasks)
    if expected == 0 and not selection.sharded_out:
        raise InputError([_empty_reason(source, table, config)])
    return Plan(tasks=tasks, expected=expected, materialized_bytes=size, orders=orders)


def _empty_reason(source: _Source, table: TaskTable, config: RunConfig) -> str:
    """Say why a plan holds no rollout (called only when it holds none)."""
    if table.count == 0:
        return f"{source.name} holds no rows (it is empty or blank); nothing to collect"
    if config.limit == 0:
        return "limit 0 keeps no task, so there is nothing to collect; use --limit 1 or more"
    return (
        f"task_ids {config.task_ids!r} keep no task of the {table.count} in {source.name}"
        + (f" (limit {config.limit} keeps the first {config.limit})" if config.limit else "")
        + "; list ids that the input's rows store"
    )


def _check_rows(
    source: _Source,
    resolver: Resolver,
    materializer: Materializer,
    table: TaskTable,
    problems: Problems,
) -> _Totals:
    """Pass 1: check every row, record task identity, collect every problem.

    Returns the totals of every row, which are the plan's when the selection keeps them all.
    """
    totals = _Totals()
    for line in source.lines():
        row = line.row
        problem = line.problem if row is None else check_write_back(line)
        if row is None or problem is not None:
            problems.line(source.label(line.number), str(problem))
            continue
        # checked as the prompt builds them, each held to the line limit and sized as built
        built, size, problem = materializer.prompted(row, len(line.text))
        if problem is not None:
            problems.line(source.label(line.number), problem)
            continue
        shape = check_row(built)
        for problem in shape:
            problems.line(source.label(line.number), problem)
        if shape:
            continue
        table.record(line)
        resolution = resolver.resolve(built)
        for issue in resolution.issues:
            problems.group(issue.key, source.label(line.number), issue.what, issue.remedy)
        seed_problem = materializer.check(built)
        if seed_problem:
            problems.line(source.label(line.number), seed_problem)
        # Counted as the walker will route it: the row as read, not as a prompt built it.
        copies = resolution.copies if built is row else resolver.resolve(row).copies
        totals.add(copies, size)
    return totals


class _Totals:
    """Rollouts, their bytes, repeat rounds and round-robin groups of the rows added."""

    def __init__(self) -> None:
        self.expected = self.size = self.rounds = 0
        self._groups: dict[_Group, None] = {}

    @property
    def groups(self) -> list[_Group]:
        """The (agent, environment server) groups, in order of first appearance."""
        return list(self._groups)

    def add(self, copies: Sequence[Copy], size: int) -> None:
        """Count one kept row of ``size`` bytes as read, with its routed copies."""
        for copy in copies:
            self.expected += copy.repeats
            self.size += copy.repeats * (size + _STAMP_BYTES)
            self.rounds = max(self.rounds, copy.repeats)
            self._groups.setdefault(copy.group, None)
