# Stays whole: one streaming pass (`Collection`) whose rules (identity across shards,
# duplicates, empty shards, the union plan) act on one set of per-task masks.
"""One streaming pass over the shards, then the failure resolution and the imputed zeros.

`Collection` reads every shard's materialized inputs (the plan), then its rollouts file, then its
failures sidecar, keeping only the per-task state of `stats` and the latest failure per rollout;
row payloads are never held (except the reduced rows a server call needs, and only when one is
asked for). The rules, documented where the user sees them (``trollout aggregate --help``):

- A rollout's identity across shards is its task's content (`identity`): a digest of its
  materialized row (or of its landed rows' parameters) without the collector's stamps and
  seed, plus its metrics group, and its rollout index. Shards of separate runs (each numbering
  its tasks from 0) are merged without losing a task; tasks first seen in a later shard are
  renumbered in the merged files.
- Shards are read in sorted order, those with materialized inputs first (so a shard without
  them, such as a copied rollouts file, finds the tasks their rows showed). A rollouts (or
  failures) file identical to an earlier shard's is skipped when its shard has the same
  materialized inputs or none numbering it.
- A rollout lands once: the first landed row in reading order, then line order, wins; later
  landed rows of the same rollout are duplicates, reported per shard and not counted. A landed
  row beats any failure of the same rollout, whichever shard holds it.
- The group of a row is its agent (``agent_ref.name``), or, for a row routed by taskset without
  an agent, its environment server.
- A plan given (``materialized_inputs_jsonl_fpath``) is read first and adds to the expected
  rollouts. It may be several runs' plans concatenated: a ``(group, task, rollout)`` that comes
  again begins the next run's segment, numbered like a plan of its own. It numbers the rows of
  shards that have no materialized inputs of their own by task index only when it stands for
  every shard's (no shard has its own: NeMo Gym's meaning) and is one segment. Beside shards
  that keep their own (their run's numbering), it is a union of runs' plans, concatenated or
  merged (a merged plan numbers every run but the first anew), whose indices are no one run's:
  a shard without its own is then numbered by content (its rows find the tasks that planned
  shards landed), and a row that finds none is refused, naming the file.
- Rows in, rows out: a landed row is dropped as a duplicate only when it ran the
  ``responses_create_params`` (seed aside) of the row kept for that rollout; otherwise the
  numbering went wrong and the merge stops naming the row (`InputError`), never loses it.
  Every line is held to the input line limit.
- A rollouts file from which no row was read (nor from its failures) is a run where nothing
  landed when its folder shows a run a collector wrote (`_run_evidence`: its materialized
  inputs, manifest, batch status or attempt ledger beside it): a Ray block or ``--shard`` run
  handed no task, or a run stopped before anything landed. Its plan's rollouts are expected
  (missing in coverage); without materialized inputs its expected rollouts are unknown, and
  the report says so (`InputReport.unplanned`). A file with no row and none of these beside
  it (a stray file, one huge line, a file cut short) is not a run: refused, naming it.

Design note: the rejected alternative loads every row of every shard, concatenates them and
de-duplicates in memory (NeMo Gym's way); it needs memory for every payload, and a second
reading of the rows for each statistic. Here a rollout's fate is a bit in its task's masks, so
duplicate detection, coverage and the imputed zeros cost a few bytes per rollout, plus the
identity tables (`identity`): a digest and a number per task, plus one row key per task
for the duplicate check (only when several shards are merged). Rejected for the union plan:
numbering every shard by its task indices (the old reading), which merged chunk 1's task 0 into
chunk 0's and dropped its rollouts as duplicates with exit 0; and numbering a shard without
materialized inputs by a one-segment union plan's indices beside shards that keep theirs: a
merged plan's numbers are the merge's, so a copy of a later run's rollouts counted its tasks
as other tasks (2 landed of 1, exit 0). Rejected for the empty shard: refusing every file that
holds no row (a collector's block or shard handed no task is one), and accepting any (a stray
file, or a shard that is one 300 MB line, aggregated to "0 of 0" with exit 0); the lock file
is no evidence of a run (it is an empty marker a run leaves even when it never started).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import orjson
from attrs import frozen

from ..errors import InputError
from ..records import AGENT_REF, ENVIRONMENT_SERVER, ROLLOUT_INDEX, TASK_INDEX
from ..recovery.layout import RunLayout
from ..settings import DEFAULT_MAX_INPUT_LINE_BYTES
from .coverage import MISSING, OMITTED, Coverage, FailureLedger, GroupKey, RolloutKey, imputed_row
from .identity import LocalIds, TaskIds, content_digest, local_digest, row_content_digest
from .shards import MergeWriter, identical_files, read_lines
from .stats import GroupStats, is_masked, metric_columns, popcount

__all__ = ["Collection", "InputReport", "group_key", "reduce_row"]

ServerRows = defaultdict[GroupKey, list[tuple[int, int, bytes]]]
_DENSE_TASKS = 1 << 24  # task indices below this are kept as bits (`_RolloutBits`)


@frozen
class InputReport:
    """What was read, and what was set aside.

    Attributes:
        shards: the rollouts files, in the order read (those with materialized inputs first).
        skipped: files identical to one read before, with that file.
        duplicates: per shard, landed rows whose rollout was already read (counted once).
        torn: ``file:line`` of torn last lines skipped.
        outside_plan: landed rows of rollouts absent from the materialized inputs that were read.
        renumbered: tasks whose merged number differs from their run's (a later shard's task
            whose index an earlier shard's other task already had).
        unplanned: run folders where nothing landed or failed, without materialized inputs:
            their planned rollouts are unknown, so coverage leaves them out.
    """

    shards: tuple[Path, ...]
    skipped: tuple[tuple[Path, Path], ...] = ()
    duplicates: dict[str, int] = attrs.field(factory=dict)
    torn: tuple[str, ...] = ()
    outside_plan: int = 0
    renumbered: int = 0
    unplanned: tuple[Path, ...] = ()

    def lines(self) -> list[str]:
        """Return one line per finding worth telling the user."""
        out = [f"skipped {str(p)!r}: identical to {str(first)!r}" for p, first in self.skipped]
        out += [
            f"{str(shard)!r}: {n} duplicate rollout row{'s' if n > 1 else ''} already read "
            "from an earlier shard; counted once"
            for shard, n in self.duplicates.items()
        ]
        out += [f"skipped torn last line {where}" for where in self.torn]
        if self.outside_plan:
            out.append(f"{self.outside_plan} landed rows are not in the materialized inputs")
        if self.renumbered:
            out.append(
                f"{self.renumbered} tasks of later shards took new task numbers: each run numbers "
                "its tasks from 0, so a rollout is known by its task's content (differs from "
                "NeMo Gym, whose aggregate keys rollouts by task index and merges them)"
            )
        out += [
            f"{str(p)!r}: a run folder where nothing landed or failed, without materialized "
            "inputs: its planned rollouts are unknown, so coverage leaves them out"
            for p in self.unplanned
        ]
        return out

    def to_json(self) -> dict[str, Any]:
        """Return the report as a JSON-able mapping."""
        return {
            "shards": [str(p) for p in self.shards],
            "skipped": [{"file": str(p), "identical_to": str(f)} for p, f in self.skipped],
            "duplicates": dict(self.duplicates),
            "torn": list(self.torn),
            "outside_plan": self.outside_plan,
            "renumbered": self.renumbered,
            "unplanned": [str(p) for p in self.unplanned],
        }


def group_key(row: Mapping[str, Any]) -> GroupKey:
    """Return the metrics group of a row: its agent, else its environment server."""
    ref = row.get(AGENT_REF)
    name = ref.get("name") if isinstance(ref, Mapping) else None
    if isinstance(name, str):
        return (name, None)
    env = row.get(ENVIRONMENT_SERVER)
    return (None, env if isinstance(env, str) else None)


def reduce_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """Return a row as ``/aggregate_metrics`` takes it (docs/protocol.md section 4)."""
    out = {
        k: v for k, v in row.items() if k != "responses_create_params" and not k.startswith("ng_")
    }
    response = out.get("response")
    if isinstance(response, Mapping):
        out["response"] = {"usage": response["usage"]} if "usage" in response else {}
    return out


def _identity(path: Path, number: int, row: Mapping[str, Any]) -> tuple[int, int]:
    task, rollout = row.get(TASK_INDEX), row.get(ROLLOUT_INDEX)
    if type(task) is not int or type(rollout) is not int or task < 0 or rollout < 0:
        raise InputError(
            [
                f"{path}:{number}: a row needs non-negative integer {TASK_INDEX} and "
                f"{ROLLOUT_INDEX} (got {task!r}, {rollout!r}); aggregate files a collector wrote"
            ]
        )
    return task, rollout


class _Shard:
    """One shard as it is read: its files, its plan's numbering and its own."""

    def __init__(self, order: int, layout: RunLayout, plan: Path | None) -> None:
        self.order = order  # its place in the reading order
        self.layout = layout
        self.plan = plan  # the plan file read for it (the first of identical ones), or None
        self.ids: LocalIds | None = None  # the plan's numbering (shared by identical plans)
        self.extra = LocalIds()  # tasks numbered from rows outside the plan
        self.noted = LocalIds()  # planned tasks whose row key is recorded
        self.seen = Counter[int]()  # occurrences of the row keys of its tasks


class Collection:
    """The state of one aggregation: groups, failures, and what was read."""

    def __init__(
        self,
        keep_classes: frozenset[str] | None,
        *,
        keep_rows: bool = False,
        max_line_bytes: int | None = DEFAULT_MAX_INPUT_LINE_BYTES,
    ) -> None:
        self.max_line_bytes = max_line_bytes  # the input line limit, for every file read
        self.groups: dict[GroupKey, GroupStats] = {}
        self.imputed: dict[GroupKey, GroupStats] = {}
        self.ledger = FailureLedger(keep_classes)
        self.server_rows: ServerRows | None = defaultdict(list) if keep_rows else None
        self.coverage: dict[GroupKey, Coverage] = {}
        self.task_ids = TaskIds()
        self._torn: list[str] = []
        self._duplicates: Counter[str] = Counter()
        self._outside_plan = 0
        self._planned = False
        self._rows_only = False  # some shard has no plan: planned tasks record their row keys
        self._plans: dict[Path, list[LocalIds]] = {}  # each plan read: its segments' numbering
        self._read_rows: Counter[Path] = Counter()  # rows read per file
        self._unnumbered: Counter[Path] = Counter()  # per shard: rows no plan could number
        self._row_keys: dict[tuple[GroupKey, int], int] = {}  # (group, task) -> a landed row key
        self.shards: list[_Shard] = []
        self.report = InputReport(())

    def group(self, key: GroupKey, row: Mapping[str, Any] | None = None) -> GroupStats:
        """Return a group's state (created on first use), noting the row's environment server."""
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = GroupStats()
        env = row.get(ENVIRONMENT_SERVER) if row is not None else None
        if isinstance(env, str) and env not in group.environment_servers:
            group.environment_servers[env] = None
        return group

    def read(
        self,
        shards: Sequence[Path],
        merge: MergeWriter | None = None,
        *,
        plan: Path | None = None,
    ) -> None:
        """Read every shard folder: plans first, then each shard's rollouts and failures.

        Args:
            shards: the rollouts files, in order.
            merge: the merged run folder being written, if any.
            plan: a materialized-inputs file (``materialized_inputs_jsonl_fpath``): read first,
                its rollouts are expected; it numbers the rows of every shard that has no
                materialized inputs of its own.

        Raises:
            InputError: a line is not a JSON object or longer than the line limit; a shard
                holds no row at all; a landed row would be dropped as a duplicate of a
                rollout that ran other inputs.
        """
        self.task_ids.single = len(shards) == 1 and plan is None  # one run's numbering
        shards = _planned_first(shards)
        layouts = [RunLayout.for_output(p) for p in shards]
        owns = [lay.materialized_inputs.is_file() for lay in layouts]
        plans = [
            lay.materialized_inputs if own else plan for lay, own in zip(layouts, owns, strict=True)
        ]
        given = [plan] if plan is not None else []
        files = dict.fromkeys(
            [*given, *(p for lay, pl in zip(layouts, plans, strict=True) for p in _files(lay, pl))]
        )
        same = identical_files([p for p in files if p.is_file()])
        for order, (lay, pl) in enumerate(zip(layouts, plans, strict=True)):
            first = same.get(pl, pl) if pl is not None and pl.is_file() else None
            self.shards.append(_Shard(order, lay, first))
        for path in [*(same.get(g, g) for g in given), *(s.plan for s in self.shards)]:
            if path is not None and path not in self._plans:
                self._plans[path] = self._read_plan(path, merge)
        stands_for_all = not any(owns)  # the plan given stands for every shard's own
        for shard, own in zip(self.shards, owns, strict=True):
            segments = self._plans.get(shard.plan) if shard.plan is not None else None
            # A plan of several runs (concatenated, or merged beside shards that keep their
            # own) numbers no one run: it cannot number a shard's rows by index.
            by_index = segments is not None and len(segments) == 1 and (own or stands_for_all)
            shard.ids = _first(segments) if segments is not None and by_index else None
        self._planned = bool(self._plans)
        self._rows_only = not self.task_ids.single and any(s.ids is None for s in self.shards)
        skipped: list[tuple[Path, Path]] = []
        for shard, own_plan in zip(self.shards, plans, strict=True):
            if shard.plan is not None and own_plan is not None and shard.plan != own_plan:
                skipped.append((own_plan, shard.plan))
            skipped += self._read_outcomes(shard, same, merge)
            shard.seen.clear()  # occurrences count within one shard: done with them
        unplanned = self._empty_runs(skipped)
        self._refuse_unnumbered()
        self.report = InputReport(
            shards=tuple(shards),
            skipped=tuple(skipped),
            duplicates={str(p): n for p, n in self._duplicates.items()},
            torn=tuple(self._torn),
            outside_plan=self._outside_plan,
            renumbered=self.task_ids.renumbered,
            unplanned=unplanned,
        )

    def _refuse_unnumbered(self) -> None:
        """Refuse rows that only a union plan could number (`read`, `_plan_rows`).

        Such a plan numbers no one run (several runs concatenated repeat task indices; a merged
        plan numbers every run but the first anew), so a shard without materialized inputs of
        its own is numbered by content; rows whose content matched no planned task would be
        counted beside the plan's, the coverage wrong.
        """
        for path, count in self._unnumbered.items():
            plan = next(s.plan for s in self.shards if s.layout.rollouts == path)
            rows = "rows match" if count > 1 else "row matches"
            raise InputError(
                [
                    f"{path}: {count} landed {rows} no task of the plan {str(plan)!r} by "
                    "content, and that plan holds several runs' materialized inputs "
                    "(concatenated, or merged beside shards that keep their own), whose task "
                    "numbers are no one run's, so it cannot number a shard without "
                    "materialized inputs of its own; keep each run's "
                    "<stem>_materialized_inputs.jsonl beside its rollouts file"
                ]
            )

    def _empty_runs(self, skipped: Sequence[tuple[Path, Path]]) -> tuple[Path, ...]:
        """Check the shards of which not one row was read; return those whose plan is unknown.

        Such a shard is a run where nothing landed when its folder is a run a collector wrote
        (`_run_evidence`): its materialized inputs (even of no task), or the plan given for
        them, tell its expected rollouts; without either, they are unknown (returned, for the
        report). A shard whose file was skipped as a copy was read through its original.

        Raises:
            InputError: a shard holds no row and nothing beside it shows a run (a stray file,
                one huge or torn line).
        """
        copies = {path for path, _ in skipped}
        unplanned = []
        for shard in self.shards:
            layout = shard.layout
            files = [layout.rollouts, layout.failures, layout.materialized_inputs]
            files += [shard.plan] if shard.plan is not None else []
            if any(self._read_rows[p] for p in files) or any(p in copies for p in files):
                continue
            if layout.materialized_inputs.is_file():
                continue  # a run planned no rollout (a block or shard handed no task)
            if any(p.is_file() for p in _run_evidence(layout)):
                unplanned.append(layout.rollouts)
                continue
            torn = (
                " (its only line is torn: cut short and not JSON)"
                if any(t.startswith(f"{layout.rollouts}:") for t in self._torn)
                else ""
            )
            raise InputError(
                [
                    f"{layout.rollouts}: holds no rollout row{torn}, and no run folder beside it "
                    "(none of the materialized inputs, manifest, batch status or attempt "
                    "ledger a collector writes); aggregate run folders a collector wrote, or "
                    "leave this file out of the inputs"
                ]
            )
        return tuple(unplanned)

    def _read_outcomes(
        self, shard: _Shard, same: Mapping[Path, Path], merge: MergeWriter | None
    ) -> list[tuple[Path, Path]]:
        """Read a shard's rollouts, then its failures; return the files skipped as copies."""
        skipped = []
        layout = shard.layout
        for path, read in (
            (layout.rollouts, self._read_rollouts),
            (layout.failures, self._read_failures),
        ):
            if not path.is_file():  # absent: nothing landed (or failed)
                continue
            copy_of = self._copy_of(shard, same.get(path))
            if copy_of is not None:
                skipped.append((path, copy_of))
            else:
                read(shard, path, merge)
        return skipped

    def _copy_of(self, shard: _Shard, first: Path | None) -> Path | None:
        """Return the earlier file this one copies, when its shard has that one's plan or none.

        None: no plan at all, or none numbering it (`read`: it is numbered by content beside a
        union plan). Such a shard is read after every shard with a plan of its own, so its
        file is the copy; read again, its failure rows (no content to find their tasks by)
        would count as rollouts of tasks of its own.
        """
        if first is None:
            return None
        owners = (s for s in self.shards if first in (s.layout.rollouts, s.layout.failures))
        owner = next(owners, None)  # None: it equals some other kind of file
        by_content = shard.ids is None  # whatever plan it was given
        return first if owner is not None and (by_content or shard.plan == owner.plan) else None

    def _rows(self, path: Path) -> Iterator[tuple[int, bytes, dict[str, Any], int, int]]:
        for number, raw, row in read_lines(path, self._torn, self.max_line_bytes):
            task, rollout = _identity(path, number, row)
            self._read_rows[path] += 1
            yield number, raw, row, task, rollout

    def _plan_rows(self, path: Path) -> Iterator[tuple[int, bytes, dict[str, Any], int, int]]:
        """Yield a plan's rows with their segment: a new one where a rollout repeats.

        A plan is one run's materialized inputs, or several concatenated (what a NeMo Gym user
        passes as ``materialized_inputs_jsonl_fpath`` for chunks collected separately, each
        numbering its tasks from 0): the run whose rows follow begins where a ``(group, task,
        rollout)`` comes a second time.
        """
        segment, seen = 0, _RolloutBits()
        for _, raw, row, task, rollout in self._rows(path):
            if not seen.add(group_key(row), task, rollout):
                segment, seen = segment + 1, _RolloutBits()
                seen.add(group_key(row), task, rollout)
            yield segment, raw, row, task, rollout

    def _read_plan(self, path: Path, merge: MergeWriter | None) -> list[LocalIds]:
        """Read a plan: each of its segments numbered like a run of its own (`_plan_rows`)."""
        segments: list[LocalIds] = []
        seen = self.task_ids.occurrences()
        for segment, raw, row, task, rollout in self._plan_rows(path):
            if segment == len(segments):
                segments.append(LocalIds())
                seen = self.task_ids.occurrences()
            ids = segments[segment]
            key = group_key(row)
            merged = ids.get(key, task)
            if merged is None:
                merged = task
                if not self.task_ids.single:
                    digest = content_digest(row, key)
                    merged = self.task_ids.assign(key, task, digest, seen)
                ids.set(key, task, merged)
            state = self.group(key, row).task(merged)
            bit = 1 << rollout
            if state.known & bit:
                continue
            state.known |= bit
            if merge is not None:
                merge.materialized.write(_renumbered(raw, row, task, merged))
        return segments

    def _merged_task(self, shard: _Shard, key: GroupKey, task: int, row: Mapping[str, Any]) -> int:
        """Return the merged number of a row's task (numbering it from the row if unplanned)."""
        if self.task_ids.single:
            return task
        merged = shard.ids.get(key, task) if shard.ids is not None else None
        if merged is not None:
            if self._rows_only and shard.noted.get(key, task) is None:
                self._note_row_key(shard, key, task, row, merged)
            return merged
        merged = shard.extra.get(key, task)
        if merged is None:
            digest = row_content_digest(row, key)
            if digest is None:
                digest = local_digest(shard.order, key)
            merged = self.task_ids.assign(key, task, digest, shard.seen)
            shard.extra.set(key, task, merged)
        return merged

    def _note_row_key(
        self, shard: _Shard, key: GroupKey, task: int, row: Mapping[str, Any], merged: int
    ) -> None:
        """Record a planned task's row key, so that rows read without a plan find it."""
        digest = row_content_digest(row, key)
        if digest is not None:  # a failure row has no content: its task's landed row tells
            self.task_ids.note(digest, shard.seen, merged)
            shard.noted.set(key, task, merged)

    def _read_rollouts(self, shard: _Shard, path: Path, merge: MergeWriter | None) -> None:
        server_rows = self.server_rows
        for number, raw, row, local, rollout in self._rows(path):
            key = group_key(row)
            group = self.group(key, row)
            task = self._merged_task(shard, key, local, row)
            state = group.task(task)
            bit = 1 << rollout
            if not self.task_ids.single:
                self._check_same_task(path, number, key, task, row)
            if state.landed & bit:
                self._duplicates[str(path)] += 1
                continue
            if self._planned and not state.known & bit:
                self._outside_plan += 1
                if shard.ids is None and shard.plan is not None:
                    self._unnumbered[path] += 1
            group.add_row(task, rollout, metric_columns(row), masked=is_masked(row))
            if merge is not None:
                merge.rollouts.write(_renumbered(raw, row, local, task))
            if server_rows is not None:
                reduced = reduce_row(row)
                reduced[TASK_INDEX] = task
                server_rows[key].append((task, rollout, orjson.dumps(reduced)))

    def _check_same_task(
        self, path: Path, number: int, key: GroupKey, task: int, row: Mapping[str, Any]
    ) -> None:
        """Refuse a landed row numbered as a task whose other landed rows ran other inputs.

        The identity rules count a rollout once; this is their check: rows are dropped as
        duplicates only when they ran what the kept row ran, so a merge never loses a distinct
        rollout with exit 0 (a plan that numbers shards wrongly is the likely cause).
        """
        digest = row_content_digest(row, key)
        if digest is None:
            return
        kept = self._row_keys.setdefault((key, task), digest)
        if kept != digest:
            raise InputError(
                [
                    f"{path}:{number}: this landed row and an earlier one are numbered as the "
                    f"same task (merged task {task} of {_group_name(key)}) but ran different "
                    "responses_create_params, so one would be lost; check that each shard's "
                    "materialized inputs (or materialized_inputs_jsonl_fpath) are the ones "
                    "its run wrote"
                ]
            )

    def _read_failures(self, shard: _Shard, path: Path, merge: MergeWriter | None) -> None:
        for number, raw, row, local, rollout in self._rows(path):
            key = group_key(row)
            self.group(key, row)
            task = self._merged_task(shard, key, local, row)
            self.ledger.add((key, task, rollout), row, (shard.order, number))
            if merge is not None:
                merge.failures.write(_renumbered(raw, row, local, task))

    def resolve(self, *, count_missing: bool) -> None:
        """Settle every rollout (landed, failed, omitted, missing) and add the imputed zeros."""
        pending: dict[RolloutKey, tuple[str, Mapping[str, Any]]] = {}
        failed_bits: defaultdict[tuple[GroupKey, int], int] = defaultdict(int)
        tallies: defaultdict[GroupKey, Counter[str]] = defaultdict(Counter)
        recovered: Counter[GroupKey] = Counter()
        for (key, task, rollout), mark in self.ledger.marks.items():
            state = self.group(key).task(task)
            bit = 1 << rollout
            state.known |= bit
            if state.landed & bit:
                recovered[key] += 1
                continue
            failed_bits[key, task] |= bit
            tallies[key][mark.failure_class] += 1
            if mark.kept or (mark.failure_class == OMITTED and count_missing):
                pending[key, task, rollout] = (mark.failure_class, mark.row)
        for key, group in self.groups.items():
            for task, state in group.tasks.items():
                missing = state.known & ~state.landed & ~failed_bits.get((key, task), 0)
                tallies[key][MISSING] += popcount(missing)
                if count_missing:
                    pending.update(((key, task, r), (MISSING, {})) for r in _bits(missing))
        self._impute(pending)
        imputed: defaultdict[GroupKey, Counter[str]] = defaultdict(Counter)
        for (key, _, _), (label, _) in pending.items():
            imputed[key][label] += 1
        for key, group in self.groups.items():
            self.coverage[key] = _coverage(group, tallies[key], imputed[key], recovered[key])

    def _impute(self, pending: dict[RolloutKey, tuple[str, Mapping[str, Any]]]) -> None:
        """Add the imputed rows to the metric input, task fields taken from the plan."""
        if not pending:
            return
        todo = dict(pending)
        for path, segments in self._plans.items():
            for segment, _, row, local, rollout in self._plan_rows(path):
                key = group_key(row)
                task = segments[segment].get(key, local)
                item = todo.pop((key, task, rollout), None) if task is not None else None
                if item is not None and task is not None:
                    self._add_imputed(key, task, rollout, row, item[1])
        for (key, task, rollout), (_, failure_row) in todo.items():
            self._add_imputed(key, task, rollout, {}, failure_row)

    def _add_imputed(
        self,
        key: GroupKey,
        task: int,
        rollout: int,
        plan: Mapping[str, Any],
        failure: Mapping[str, Any],
    ) -> None:
        identity: dict[str, Any] = {TASK_INDEX: task, ROLLOUT_INDEX: rollout}
        if key[0] is not None:
            identity[AGENT_REF] = {"name": key[0]}
        row = imputed_row(identity, plan, failure)
        group = self.imputed.setdefault(key, GroupStats())
        group.add_row(task, rollout, metric_columns(row), masked=is_masked(row))
        if self.server_rows is not None:
            self.server_rows[key].append((task, rollout, orjson.dumps(reduce_row(row))))


def _files(layout: RunLayout, plan: Path | None) -> tuple[Path, ...]:
    return (
        (layout.rollouts, layout.failures)
        if plan is None
        else (plan, layout.rollouts, layout.failures)
    )


def _run_evidence(layout: RunLayout) -> tuple[Path, ...]:
    """Return the files that show a rollouts file is a run folder's, when one is beside it.

    A collector writes them (a merged output has its materialized inputs too); not the metrics
    or report (``aggregate`` writes those beside any one file it reads), nor the lock (a run
    leaves it even when it never started).
    """
    return (layout.materialized_inputs, layout.manifest, layout.batch_status, layout.attempts)


def _group_name(key: GroupKey) -> str:
    return f"agent {key[0]!r}" if key[0] is not None else f"environment server {key[1]!r}"


def _planned_first(shards: Sequence[Path]) -> list[Path]:
    """Return the shards in reading order: those with materialized inputs first, each sorted."""
    return sorted(shards, key=lambda p: not RunLayout.for_output(p).materialized_inputs.is_file())


def _first(segments: list[LocalIds]) -> LocalIds:
    return segments[0] if segments else LocalIds()


class _RolloutBits:
    """A set of ``(group, task, rollout)``: a bit per task for each group and rollout index."""

    __slots__ = ("_dense", "_sparse")

    def __init__(self) -> None:
        self._dense: dict[tuple[GroupKey, int], bytearray] = {}
        self._sparse: set[tuple[GroupKey, int, int]] = set()

    def add(self, key: GroupKey, task: int, rollout: int) -> bool:
        """Add a rollout; return False when it was there already."""
        if not 0 <= task < _DENSE_TASKS:
            if (key, task, rollout) in self._sparse:
                return False
            self._sparse.add((key, task, rollout))
            return True
        bits = self._dense.setdefault((key, rollout), bytearray())
        if task >> 3 >= len(bits):
            bits.extend(bytes(max((task >> 3) + 1, len(bits) * 2) - len(bits)))
        mask = 1 << (task & 7)
        if bits[task >> 3] & mask:
            return False
        bits[task >> 3] |= mask
        return True


def _renumbered(raw: bytes, row: dict[str, Any], local: int, task: int) -> bytes:
    """Return a row's line for the merged files, with its merged task number."""
    if task == local:
        return raw
    return orjson.dumps({**row, TASK_INDEX: task}) + b"\n"


def _bits(mask: int) -> Iterator[int]:
    index = 0
    while mask:
        if mask & 1:
            yield index
        mask >>= 1
        index += 1


def _coverage(
    group: GroupStats, tallies: Counter[str], imputed: Counter[str], recovered: int
) -> Coverage:
    states = group.tasks.values()
    scored = sum(len(s.values("reward")) for s in states)
    rows = sum(s.rows for s in states)
    failed = {c: n for c, n in tallies.items() if c not in (MISSING, OMITTED)}
    return Coverage(
        expected=sum(popcount(s.known) for s in states),
        landed=sum(popcount(s.landed) for s in states),
        scored=scored,
        masked=sum(s.masked for s in states),
        unscored=rows - scored,
        failed=failed,
        omitted=tallies[OMITTED],
        missing=tallies[MISSING],
        imputed=dict(imputed),
        recovered=recovered,
    )
