"""A rollout's identity across runs: what it ran, not where a run numbered it.

Each run numbers its tasks from 0 (docs/protocol.md section 8), so ``(group, task, rollout)`` names
a rollout only inside one run folder: two chunks of a dataset collected by separate runs both
have a task 0, and they are different tasks. Across shards a task is therefore known by its
*content*, and its metrics group. Two rows are the same rollout when their tasks have the same
content and they have the same rollout index; a copied shard, a re-run chunk or a merged output
merged again then counts once, and two tasks that both have index 0 are never merged.

Content comes from the rows alone, never from a shard's side files: a copied rollouts file has
no materialized inputs and no manifest, and a merged folder has no manifest. A task has up to
two keys, each computed the same way in every shard:

- its *plan key* (`content_digest`), when its shard has materialized inputs: the materialized
  row minus every top-level ``_ng_*`` key except ``_ng_rollout_id`` (an explicit id is the
  dataset's) and minus ``agent_ref`` (the group is part of the key anyway);
- its *row key* (`row_content_digest`), once a row of it landed: that row's
  ``responses_create_params``. An agent echoes them, often with its defaults filled in (NeMo
  Gym's agents do), so a row key is a kind of its own, never compared with a plan key.

Both leave out any ``seed`` in ``responses_create_params.metadata.extra_body``, whoever put it
there: a collector's seed differs between the rollouts of a task (and, hashed, between runs),
and a shard cannot always say whether its collector added seeds. The extra_body (and a
metadata left empty) is dropped when the seed was all it held, so a seeded and an unseeded run
of the same task agree. The price: dataset rows that differ only in their seed are one task
across shards (within one shard they stay apart, below).

Two shards' tasks are the same when they share a key. The reader reads every plan first, then
the rows of the shards that have a plan, recording each planned task's row key
(`TaskIds.note`), then the shards without one: a copied rollouts file, whole or in part, finds
the tasks its rows belong to whatever the echo did to their parameters. Row keys of planned
tasks are recorded only when some shard has no plan (they cost a digest per task, and nothing
else needs them), so rows outside their own shard's plan (reported) match only each other. A
task known only from failure rows (they carry no content) stays its shard's own (never merged
with another shard); a failures file identical to an earlier shard's is skipped instead.

Occurrences. Within one shard, two tasks can have the same content (rows that differ only in a
stale ``_ng_*`` key or a seed, or that an override made equal). The k-th task of a shard with
some key is that key's occurrence k, and it matches occurrence k of another shard, so a shard
never merges two of its own tasks: the merged number of tasks with some content is the largest
number any one shard holds. No path drops a distinct rollout of a shard.

Task numbers. Per group, a task keeps its run's index when no task took that number before,
else it gets the next number above the largest taken: a single run keeps its numbering, and
chunks merged in order are numbered like one run over the whole dataset. The merged files
carry these numbers.

Memory: per distinct task one 16-byte digest (as an int) and one number for each key it has,
and per shard a bit per task that kept its number or 8 bytes per one renumbered (`LocalIds`),
plus, while it is read, an occurrence count per key; never a row. A single shard needs no
digest at all: its tasks keep their numbers (`TaskIds(single=True)`).

Design notes: the rejected alternative keyed rollouts by ``(group, task, rollout)`` across
shards (NeMo Gym's ``_identity_key``): shards of separate runs then silently lose every task
whose index another shard also used. Reading which seeds a collector added from the shard's
manifest was tried and dropped: a copy or a merged output lacks it, so the same task got two
contents and its rollouts were counted twice.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections import Counter
from collections.abc import Mapping
from typing import Any, Final, TypeAlias

import orjson

__all__ = ["LocalIds", "TaskIds", "content_digest", "row_content_digest"]

GroupKey: TypeAlias = tuple[str | None, str | None]  # (agent, environment server if no agent)

_ROLLOUT_ID: Final = "_ng_rollout_id"
_PARAMS: Final = "responses_create_params"
_DENSE_LIMIT: Final = 1 << 24  # task indices below this live in an array, above in a dict
_OCCURRENCE_BITS: Final = 24
_PLAN: Final = b"plan"
_ROW: Final = b"row"
_LOCAL: Final = b"local"


def content_digest(row: Mapping[str, Any], group: GroupKey) -> int:
    """Return the plan key of a materialized row's task in its group (an int)."""
    content = {
        key: value
        for key, value in row.items()
        if not (key.startswith("_ng_") and key != _ROLLOUT_ID) and key != "agent_ref"
    }
    params = content.get(_PARAMS)
    if isinstance(params, Mapping):
        content[_PARAMS] = _without_seed(params)
    return _digest(_PLAN, group, content)


def row_content_digest(row: Mapping[str, Any], group: GroupKey) -> int | None:
    """Return the row key of a landed row's task from its ``responses_create_params``, or None."""
    params = row.get(_PARAMS)
    if not isinstance(params, Mapping):
        return None
    return _digest(_ROW, group, _without_seed(params))


def local_digest(shard: int, group: GroupKey) -> int:
    """Return the digest of a task only its own shard knows (never equal to another's)."""
    return _digest(_LOCAL, group, shard)


def _digest(kind: bytes, group: GroupKey, content: Any) -> int:
    data = orjson.dumps(
        [kind.decode(), list(group), content],
        option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS,
    )
    return int.from_bytes(hashlib.blake2b(data, digest_size=16).digest(), "big")


def _without_seed(params: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = params.get("metadata")
    if not isinstance(metadata, Mapping) or "extra_body" not in metadata:
        return params
    extra = metadata["extra_body"]
    parsed = _json_object(extra)
    if parsed is None or "seed" not in parsed:
        return params
    rest = {k: v for k, v in parsed.items() if k != "seed"}
    new_metadata = {k: v for k, v in metadata.items() if k != "extra_body"}
    if rest:
        new_metadata["extra_body"] = rest
    out = {k: v for k, v in params.items() if k != "metadata"}
    if new_metadata:
        out["metadata"] = new_metadata
    return out


def _json_object(value: Any) -> dict[str, Any] | None:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) else None
    return None


class LocalIds:
    """One shard's task numbers in the merged numbering: (group, local task) -> merged task.

    Most tasks keep their run's number, so those cost one bit (`_same`); a renumbered task
    takes an 8-byte slot (`_moved`, made only for a group that has one); indices past
    `_DENSE_LIMIT` (or negative) go to a dict.
    """

    __slots__ = ("_moved", "_same", "_sparse")

    def __init__(self) -> None:
        self._same: dict[GroupKey, bytearray] = {}
        self._moved: dict[GroupKey, array[int]] = {}
        self._sparse: dict[tuple[GroupKey, int], int] = {}

    def get(self, group: GroupKey, task: int) -> int | None:
        """Return the merged number of a local task, or None when unknown."""
        if not 0 <= task < _DENSE_LIMIT:
            return self._sparse.get((group, task))
        moved = self._moved.get(group)
        if moved is not None and task < len(moved) and moved[task] >= 0:
            return moved[task]
        bits = self._same.get(group)
        if bits is not None and task >> 3 < len(bits) and bits[task >> 3] >> (task & 7) & 1:
            return task
        return None

    def set(self, group: GroupKey, task: int, merged: int) -> None:
        """Record the merged number of a local task."""
        if not 0 <= task < _DENSE_LIMIT or merged >= 1 << 62:
            self._sparse[(group, task)] = merged
        elif merged == task:
            bits = self._same.setdefault(group, bytearray())
            if task >> 3 >= len(bits):
                bits.extend(bytes(max((task >> 3) + 1, len(bits) * 3 // 2) - len(bits)))
            bits[task >> 3] |= 1 << (task & 7)
        else:
            moved = self._moved.setdefault(group, array("q"))
            if task >= len(moved):
                moved.extend([-1] * (max(task + 1, len(moved) * 3 // 2) - len(moved)))
            moved[task] = merged


class _Numbers:
    """The task numbers taken in one group, and the next free one above them all."""

    __slots__ = ("_dense", "_sparse", "next")

    def __init__(self) -> None:
        self._dense = bytearray()
        self._sparse: set[int] = set()
        self.next = 0

    def take(self, preferred: int) -> int:
        """Take ``preferred`` if free, else the next number above every one taken."""
        number = preferred if preferred >= 0 and not self._taken(preferred) else self.next
        self._mark(number)
        self.next = max(self.next, number + 1)
        return number

    def _taken(self, number: int) -> bool:
        if number < _DENSE_LIMIT:
            return number < len(self._dense) and bool(self._dense[number])
        return number in self._sparse

    def _mark(self, number: int) -> None:
        if number < _DENSE_LIMIT:
            if number >= len(self._dense):
                self._dense.extend(bytes(max(number + 1, 2 * len(self._dense)) - len(self._dense)))
            self._dense[number] = 1
        else:
            self._sparse.add(number)


class TaskIds:
    """The merged numbering of every task of every shard (module docstring)."""

    def __init__(self, *, single: bool = False) -> None:
        self.single = single  # one shard: every task keeps its number, nothing is digested
        self._by_key: dict[int | tuple[int, int], int] = {}
        self._numbers: dict[GroupKey, _Numbers] = {}
        self.renumbered = 0  # tasks whose merged number differs from their run's

    def occurrences(self) -> Counter[int]:
        """Return a fresh occurrence counter, one per shard (or per plan file) read."""
        return Counter()

    def assign(
        self,
        group: GroupKey,
        local_task: int,
        digest: int,
        seen: Counter[int],
    ) -> int:
        """Return the merged number of a shard's task with content ``digest``.

        Args:
            group: the task's metrics group.
            local_task: its index in its own run.
            digest: its content digest (`content_digest`, `row_content_digest`, ...).
            seen: the shard's occurrence counter (`occurrences`); updated here.
        """
        key = _occurrence_key(digest, seen)
        merged = self._by_key.get(key)
        if merged is None:
            numbers = self._numbers.get(group)
            if numbers is None:
                numbers = self._numbers[group] = _Numbers()
            merged = self._by_key[key] = numbers.take(local_task)
        if merged != local_task:
            self.renumbered += 1
        return merged

    def note(self, digest: int, seen: Counter[int], merged: int) -> None:
        """Record another key of a shard's task numbered ``merged`` (its row key).

        A key some task already has keeps that task: two tasks of different plan keys stay two.

        Args:
            digest: the task's other content digest (`row_content_digest`).
            seen: the shard's occurrence counter for that kind of key; updated here.
            merged: the task's merged number.
        """
        self._by_key.setdefault(_occurrence_key(digest, seen), merged)


def _occurrence_key(digest: int, seen: Counter[int]) -> int | tuple[int, int]:
    """Return the table key of a shard's next task with ``digest`` (its occurrence counted)."""
    occurrence = seen[digest]
    seen[digest] = occurrence + 1
    if occurrence >> _OCCURRENCE_BITS:  # 16M tasks of one content: keep them apart anyway
        return (digest, occurrence)
    return (digest << _OCCURRENCE_BITS) | occurrence
