"""A rollout's identity across runs: what it ran, not where a run numbered it.

Each run numbers its tasks from 0 (protocol.md section 8), so ``(group, task, rollout)`` names
a rollout only inside one run folder: two chunks of a dataset collected by separate runs both
have a task 0, and they are different tasks. Across shards a task is therefore known by its
*content*: a digest of its materialized row without the collector's stamps, and its metrics
group. Two rows are the same rollout when their tasks have the same content and they have the
same rollout index; a copied shard or a re-run chunk then counts once, and two tasks that both
have index 0 are never merged.

The content digest (`content_digest`) covers the materialized row minus:

- every top-level ``_ng_*`` key except ``_ng_rollout_id`` (an explicit id is the dataset's),
  and ``agent_ref`` (the group is part of the key anyway);
- the seed the collector put in ``responses_create_params.metadata.extra_body``: a run's
  manifest says whether it added seeds (``num_repeats_add_seed``, per agent), in which case
  any seed is the collector's (it replaces the dataset's); without a manifest (a NeMo Gym
  shard) a seed equal to the rollout index is NeMo Gym's and is left out. The extra_body (and a
  metadata left empty) is dropped when the seed was all it held, so a seeded and an unseeded
  run of the same task agree.

Occurrences. Within one shard, two tasks can have the same content (rows that differ only in a
stale ``_ng_*`` key, or that an override made equal). The k-th task of a shard with some
content is that content's occurrence k, and it matches occurrence k of another shard, so a
shard never merges two of its own tasks: the merged number of tasks with some content is the
largest number any one shard holds. No path drops a distinct rollout of a shard.

Shards without materialized inputs (or rows outside them) take a task's content from its first
landed row's ``responses_create_params``, a digest of another kind that never equals a plan's;
a task known only from failure rows stays its shard's own (never merged with another shard).

Task numbers. Per group, a task keeps its run's index when no task took that number before,
else it gets the next number above the largest taken: a single run keeps its numbering, and
chunks merged in order are numbered like one run over the whole dataset. The merged files
carry these numbers.

Memory: one 16-byte digest (as an int) and one number per distinct task, and per shard a bit
per task that kept its number or 8 bytes per one renumbered (`LocalIds`); never a row. A single
shard needs no digest at all: its tasks keep their numbers (`TaskIds(single=True)`).

Design note: the rejected alternative keyed rollouts by ``(group, task, rollout)`` across
shards (NeMo Gym's ``_identity_key``): shards of separate runs then silently lose every task
whose index another shard also used.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections import Counter
from collections.abc import Mapping
from typing import Any, Final, TypeAlias

import orjson

__all__ = ["LocalIds", "SeedRule", "TaskIds", "content_digest", "row_content_digest"]

GroupKey: TypeAlias = tuple[str | None, str | None]  # (agent, environment server if no agent)

_ROLLOUT_ID: Final = "_ng_rollout_id"
_ROLLOUT_INDEX: Final = "_ng_rollout_index"
_PARAMS: Final = "responses_create_params"
_DENSE_LIMIT: Final = 1 << 24  # task indices below this live in an array, above in a dict
_OCCURRENCE_BITS: Final = 24
_PLAN: Final = b"plan"
_ROW: Final = b"row"
_LOCAL: Final = b"local"


class SeedRule:
    """Which seeds in a shard's rows the collector added (module docstring).

    Args:
        add_seed: the shard's ``num_repeats_add_seed`` from its manifest (a bool, or a mapping
            of agent to bool with ``_default``); None when the shard has no manifest.
    """

    def __init__(self, add_seed: bool | Mapping[str, Any] | None = None) -> None:
        self._add_seed = add_seed

    def collector_seed(self, agent: str | None, seed: Any, rollout: Any) -> bool:
        """Return whether ``seed`` on rollout ``rollout`` of ``agent`` is the collector's."""
        setting = self._add_seed
        if setting is None:  # no manifest: NeMo Gym's seed is the rollout index
            return type(seed) is int and seed == rollout
        if isinstance(setting, Mapping):
            chosen = setting.get(agent) if agent is not None else None
            setting = chosen if chosen is not None else setting.get("_default", False)
        return bool(setting)


def content_digest(row: Mapping[str, Any], group: GroupKey, seeds: SeedRule) -> int:
    """Return the digest of a materialized row's task content in its group (an int)."""
    content = {
        key: value
        for key, value in row.items()
        if not (key.startswith("_ng_") and key != _ROLLOUT_ID) and key != "agent_ref"
    }
    params = content.get(_PARAMS)
    if isinstance(params, Mapping):
        content[_PARAMS] = _without_seed(params, group[0], seeds, row.get(_ROLLOUT_INDEX))
    return _digest(_PLAN, group, content)


def row_content_digest(row: Mapping[str, Any], group: GroupKey, seeds: SeedRule) -> int | None:
    """Return the content digest of a landed row from its ``responses_create_params``, or None."""
    params = row.get(_PARAMS)
    if not isinstance(params, Mapping):
        return None
    content = _without_seed(params, group[0], seeds, row.get(_ROLLOUT_INDEX))
    return _digest(_ROW, group, content)


def local_digest(shard: int, group: GroupKey) -> int:
    """Return the digest of a task only its own shard knows (never equal to another's)."""
    return _digest(_LOCAL, group, shard)


def _digest(kind: bytes, group: GroupKey, content: Any) -> int:
    data = orjson.dumps(
        [kind.decode(), list(group), content],
        option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS,
    )
    return int.from_bytes(hashlib.blake2b(data, digest_size=16).digest(), "big")


def _without_seed(
    params: Mapping[str, Any], agent: str | None, seeds: SeedRule, rollout: Any
) -> Mapping[str, Any]:
    metadata = params.get("metadata")
    if not isinstance(metadata, Mapping) or "extra_body" not in metadata:
        return params
    extra = metadata["extra_body"]
    parsed = _json_object(extra)
    if parsed is None or "seed" not in parsed:
        return params
    if not seeds.collector_seed(agent, parsed["seed"], rollout):
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
        occurrence = seen[digest]
        seen[digest] = occurrence + 1
        key: int | tuple[int, int] = (digest << _OCCURRENCE_BITS) | occurrence
        if occurrence >> _OCCURRENCE_BITS:  # 16M tasks of one content: keep them apart anyway
            key = (digest, occurrence)
        merged = self._by_key.get(key)
        if merged is None:
            numbers = self._numbers.get(group)
            if numbers is None:
                numbers = self._numbers[group] = _Numbers()
            merged = self._by_key[key] = numbers.take(local_task)
        if merged != local_task:
            self.renumbered += 1
        return merged
