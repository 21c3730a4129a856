"""Selecting tasks: ``task_ids`` by the id each row stores, and ``shard`` by task identity.

NeMo Gym's ``task_ids`` keeps "only those tasks, selected by the id stored in each row"
(``preprocess_examples``). A row's stored id is read, first found, from: its ``task_id`` (for a
0.7.0 task row, ``task_id.task_id``), ``responses_create_params.metadata.task_id`` (where NeMo
Gym's own example datasets keep it, ``row-000000``), ``problem_id``, ``instance_id``. Ids compare
as text, so ``+task_ids=[7]`` selects a row whose id is ``"7"`` or ``7``.

Memory: only the listed ids are kept, each with the first task that stores it.

``shard I/N`` (`task_shard`) keeps the tasks whose identity hashes to shard I: every shard plans
the whole input, so task indices and seeds are the ones a single machine gives, and then keeps
its part, all repeats and agents of a task together (they share the task). A task's identity
here is its first row's content without the collector's ``_ng_*`` keys (an explicit
``_ng_rollout_id`` is the dataset's and stays), as sorted-key JSON, so the shard of a task
depends on nothing but that content and N: not on the file's order, on other tasks being added
or removed, or on what N was before. The union of the N shards is the one-machine plan.

Rejected alternatives: shards of consecutive task indices (``task // ceil(tasks / N)``), which
move every task when one is added to the input; and hashing the task index, which changes when
a task is inserted before it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final

import orjson

__all__ = ["STORED_ID_PLACES", "StoredIds", "stored_task_id", "task_shard"]

STORED_ID_PLACES: Final = (
    "task_id, responses_create_params.metadata.task_id, problem_id or instance_id"
)
_TOP_LEVEL: Final = ("problem_id", "instance_id")


def stored_task_id(row: Mapping[str, Any]) -> str | None:
    """Return the id a row stores for its task (module docstring), as text; None if none."""
    task_id = row.get("task_id")
    if isinstance(task_id, Mapping):
        task_id = task_id.get("task_id")
    if task_id is None:
        params = row.get("responses_create_params")
        metadata = params.get("metadata") if isinstance(params, Mapping) else None
        task_id = metadata.get("task_id") if isinstance(metadata, Mapping) else None
    for key in _TOP_LEVEL:
        if task_id is None:
            task_id = row.get(key)
    return _text(task_id)


def task_shard(row: Mapping[str, Any], count: int) -> int:
    """Return the shard, 0 to ``count - 1``, of the task whose first row is ``row``."""
    content = {
        key: value
        for key, value in row.items()
        if not (key.startswith("_ng_") and key != "_ng_rollout_id")
    }
    data = orjson.dumps(content, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    digest = hashlib.blake2b(data, digest_size=8, person=b"trollout-shard").digest()
    return int.from_bytes(digest, "big") % count


def _text(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    return str(value)


class StoredIds:
    """The tasks `task_ids` names: recorded while the input is read, numbered at the end."""

    def __init__(self, wanted: Sequence[str | int] | None) -> None:
        self._wanted = {str(task): task for task in wanted or ()}
        self._found: dict[str, int] = {}

    def record(self, row: Mapping[str, Any], key: int) -> None:
        """Note the task key of a row whose stored id is wanted (the first row wins)."""
        if self._wanted:
            found = stored_task_id(row)
            if found is not None and found in self._wanted:
                self._found.setdefault(found, key)

    def renumber(self, final: Callable[[int], int]) -> None:
        """Replace the recorded keys by the tasks' final indices."""
        self._found = {found: final(key) for found, key in self._found.items()}

    def missing(self) -> Iterator[str | int]:
        """Yield the wanted ids no row stores, as they were given."""
        return (given for text, given in self._wanted.items() if text not in self._found)

    def tasks(self) -> set[int]:
        """Return the indices of the tasks found."""
        return set(self._found.values())
