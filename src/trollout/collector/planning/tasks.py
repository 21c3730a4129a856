"""The input's tasks: which rows are one task, their indices, and which tasks a run keeps.

Task identity (`TaskTable`): a row that carries ``_ng_task_index`` keeps it; otherwise identical
rows are one task, keyed by a 16-byte blake2b digest of the canonical text. Memory is one digest
per distinct row, never the rows. Indices are assigned in two steps, because a pre-stamped index
may appear after the rows that must avoid it: the first pass numbers distinct unstamped rows
0, 1, 2, ... in order of first occurrence (ordinals); `TaskTable.finish` then gives ordinal ``k``
the ``k``-th smallest non-negative integer that no row of the input is stamped with. So with rows
stamped 0 and 2, the unstamped rows take 1, 3, 4, ... in order of first occurrence. A caller
planning rows in several calls (a training loop's steps: `frontends.rollouts.Rollouts.plan`)
numbers a call's unstamped rows from ``first_task`` instead of 0 (the same rule above it), so
the rows of two calls never share a task index.

Selection (`Selection`): ``limit N`` keeps every line of the first N distinct tasks in order of
first appearance (duplicates included); ``task_ids`` then keeps the listed tasks among those, each
on its first line only, so its repeats come from ``num_repeats`` alone. ``task_ids`` names tasks
by the id each row stores (`task_selection`), as NeMo Gym selects them; a listed id that no row
of the input has is refused. ``shard I/N`` then keeps the tasks of shard I among those
(`task_selection.task_shard`, by the content of each task's first row): a selection on the
whole plan, so every shard numbers and seeds its tasks as one machine would.

Design note: the rejected alternative numbered unstamped rows from ``max(stamped) + 1``, which
needs no second step but leaves holes, and a single stamped row with a large index (a shard of
an earlier run) would push every other task far away from 0.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Final

from attrs import frozen

from ...records import TASK_INDEX
from .input_file import Problems, SourceLine
from .task_selection import STORED_ID_PLACES, StoredIds, task_shard

__all__ = ["Selection", "TaskTable"]

_DIGEST_SIZE: Final = 16


@frozen
class Selection:
    """Which tasks a plan keeps (`limit`, `task_ids`).

    Attributes:
        tasks: the kept task indices, or None for all.
        each_once: keep only the first line of each task (`task_ids`).
        sharded_out: the shard kept none of the tasks `limit` and `task_ids` kept (a small
            input split into many shards: an empty shard, not a mistake).
    """

    tasks: frozenset[int] | None = None
    each_once: bool = False
    sharded_out: bool = False

    def includes(self, task: int) -> bool:
        """Return whether rows of ``task`` are kept."""
        return self.tasks is None or task in self.tasks


class TaskTable:
    """Task indices of the input's rows: recorded in a first pass, fixed by `finish`."""

    def __init__(
        self,
        *,
        limit: int | None = None,
        task_ids: Sequence[str | int] | None = None,
        shard: tuple[int, int] | None = None,
        first_task: int = 0,
    ) -> None:
        self._first_task = first_task  # unstamped rows are numbered from here
        self._by_digest: dict[bytes, int] = {}  # ordinals until finish(), then task indices
        self._ids = StoredIds(task_ids)  # the tasks `task_ids` names, by the id rows store
        self._stamped: set[int] = set()
        self._stamped_sorted: list[int] = []
        self.repeated: set[int] = set()  # tasks on more than one line (keys, then indices)
        self._limit = limit
        self._first: dict[int, None] = {}  # the first `limit` distinct task keys, in order
        self._shard = shard
        self._in_shard: set[int] = set()  # task keys whose first row hashes to `shard`
        self._finished = False

    @property
    def count(self) -> int:
        """Return how many distinct tasks the input holds."""
        return len(self._by_digest) + len(self._stamped)

    def record(self, line: SourceLine) -> None:
        """Record one valid row of the first pass."""
        stamped = line.row.get(TASK_INDEX) if line.row is not None else None
        if stamped is not None:
            key, seen = stamped, stamped in self._stamped
            self._stamped.add(stamped)
        else:
            digest = _digest(line.text)
            ordinal = self._by_digest.get(digest)
            seen = ordinal is not None
            if ordinal is None:
                ordinal = self._by_digest[digest] = len(self._by_digest)
            key = ~ordinal  # negative keys are ordinals until finish()
        if seen:
            self.repeated.add(key)
        elif self._shard is not None and line.row is not None:
            index, count = self._shard
            if task_shard(line.row, count) == index:
                self._in_shard.add(key)
        if line.row is not None:
            self._ids.record(line.row, key)
        if self._limit is not None and len(self._first) < self._limit:
            self._first.setdefault(key, None)

    def finish(self) -> None:
        """Turn ordinals into task indices (the rule in the module docstring)."""
        self._stamped_sorted = sorted(self._stamped)
        finals = self._finals(len(self._by_digest))
        for digest, ordinal in self._by_digest.items():
            self._by_digest[digest] = finals[ordinal]
        self.repeated = {finals[~k] if k < 0 else k for k in self.repeated}
        self._first = {(finals[~k] if k < 0 else k): None for k in self._first}
        self._in_shard = {finals[~k] if k < 0 else k for k in self._in_shard}
        self._ids.renumber(lambda k: finals[~k] if k < 0 else k)
        self._finished = True

    def _finals(self, n: int) -> list[int]:
        finals: list[int] = []
        stamped, j, candidate = self._stamped_sorted, 0, self._first_task
        while len(finals) < n:
            while j < len(stamped) and stamped[j] < candidate:
                j += 1
            if not (j < len(stamped) and stamped[j] == candidate):
                finals.append(candidate)
            candidate += 1
        return finals

    def index_of(self, row: Mapping[str, Any], text: bytes) -> int | None:
        """Return the task index of a row recorded in the first pass (None: not recorded)."""
        assert self._finished, "index_of() before finish()"
        stamped = row.get(TASK_INDEX)
        if stamped is not None:
            return int(stamped)
        return self._by_digest.get(_digest(text))

    def contains(self, task: int) -> bool:
        """Return whether some row of the input has task index ``task``."""
        if task in self._stamped:
            return True
        if task < self._first_task:
            return False
        stamped = self._stamped_sorted
        below = bisect.bisect_left(stamped, task) - bisect.bisect_left(stamped, self._first_task)
        return 0 <= task - self._first_task - below < len(self._by_digest)

    def selection(self, task_ids: Sequence[str | int] | None, problems: Problems) -> Selection:
        """Return the tasks kept by `limit` (the first N), then `task_ids`, then `shard`."""
        kept: set[int] | None = set(self._first) if self._limit is not None else None
        if task_ids is not None:
            for missing in self._ids.missing():
                problems.config(
                    f"task_ids: {missing!r} is the id of no row of the input (ids are read "
                    f"from {STORED_ID_PLACES}); list ids the rows store"
                )
            wanted = self._ids.tasks()
            kept = wanted if kept is None else wanted & kept
        each_once = task_ids is not None
        if self._shard is None:
            return Selection(None if kept is None else frozenset(kept), each_once=each_once)
        before = self.count if kept is None else len(kept)
        kept = self._in_shard if kept is None else kept & self._in_shard
        emptied = before > 0 and not kept
        return Selection(frozenset(kept), each_once=each_once, sharded_out=emptied)


def _digest(text: bytes) -> bytes:
    return hashlib.blake2b(text, digest_size=_DIGEST_SIZE).digest()
