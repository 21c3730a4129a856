"""Run ids, and the copies of a batch's rows stamped with them.

Rollout ids. Each row is copied and stamped with the batch's run id (``_ng_run_id``) and a
rollout id prefixed with it (``_ng_rollout_id``: ``<run id>-<the row's own id>``, the own id
being the row's explicit id or ``<task>-<rollout>``). Two batches, or two shards, that dispatch
the same task and rollout therefore never share an id (captures, episode ids and shards keep
them apart), and a row a batch returned that is fed to the next one has its old prefix replaced,
never nested (NeMo Gym's `_shard_rollout_id`).

Design note: the copy is made once, when the batch takes the row (an orjson round trip, which
also refuses a row that is not JSON), and that copy is what is dispatched and then handed to
the consumer, who owns it from then on. The caller's rows are never mutated or aliased. The
rejected alternative copied at delivery, which reads rows the caller may have changed since.

Stamped once. A batch recorded as a shard (`run.shards.open_shard`) stamps its rows before the
batch opens: the shard's materialized inputs are those copies, written before anything is
dispatched, and its refusals (a repeated (task, rollout) among them) come before a file is
touched. `RowStamper.stamp_all` returns them as `StampedRows`, a tuple that carries the run id
it was stamped for, and a batch of that run id given that very tuple (`batch.open_batch`)
dispatches its copies instead of stamping them a second time (an orjson round trip per row,
about a sixth of a shard's CPU). What the shard recorded is then exactly what was sent and what
the consumer gets. The proof is the object, made only by a stamper that refused repeats:
nothing else can pass for it. Rejected: recognising stamped rows by their contents (a row
carrying the batch's ``_ng_run_id``): a user may feed back a returned row with the same run id
(a replayed step), twice even, and those rows must be copied and checked like any other; and a
``stamped=True`` flag on the batch, which any caller could set over rows of its own.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeAlias

import orjson

from ...errors import ConfigError, InputError
from ...records import (
    ROLLOUT_ID,
    ROLLOUT_ID_PATTERN,
    ROLLOUT_INDEX,
    RUN_ID,
    TASK_INDEX,
    MaterializedRow,
)

__all__ = [
    "BatchRows",
    "RowStamper",
    "StampedRows",
    "check_run_id",
    "new_run_id",
    "shard_rollout_id",
]

BatchRows: TypeAlias = Iterable[MaterializedRow | Mapping[str, Any]]


def new_run_id() -> str:
    """Return a fresh run id (16 hex digits)."""
    return secrets.token_hex(8)


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` if it can prefix rollout ids.

    Raises:
        ConfigError: it does not match the rollout id pattern, or ends like an attempt suffix.
    """
    if not isinstance(run_id, str) or not ROLLOUT_ID_PATTERN.match(run_id):
        raise ConfigError(
            f"run_id must match {ROLLOUT_ID_PATTERN.pattern} (got {run_id!r}); it prefixes "
            "every rollout id of the batch; use letters, digits, '.', '_' and '-'"
        )
    return run_id


def shard_rollout_id(row: Mapping[str, Any], run_id: str) -> str:
    """Return the rollout id a batch of run ``run_id`` dispatches ``row`` under.

    The row's own id (its ``_ng_rollout_id``, else ``<task>-<rollout>``) prefixed with the run
    id; a row an earlier batch returned carries that batch's prefix (named by its
    ``_ng_run_id``), which is replaced rather than nested.
    """
    own = row.get(ROLLOUT_ID)
    if not isinstance(own, str) or not own:
        own = f"{row[TASK_INDEX]}-{row[ROLLOUT_INDEX]}"
    old = row.get(RUN_ID)
    if isinstance(old, str) and own.startswith(old + "-") and len(own) > len(old) + 1:
        own = own[len(old) + 1 :]
    return f"{run_id}-{own}"


class RowStamper:
    """Copies and stamps the rows of one batch, refusing rows that cannot be dispatched."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        # Each (task, rollout) taken: the row's index and the batch that returned it, if any.
        self._keys: dict[tuple[int, int], tuple[int, str | None]] = {}

    def __call__(self, item: MaterializedRow | Mapping[str, Any], index: int) -> MaterializedRow:
        """Return the stamped copy of ``rows[index]``.

        Raises:
            InputError: the row is not a JSON object, lacks its task and rollout indices, or
                repeats the (task, rollout) of an earlier row of the batch.
        """
        source = item.body if isinstance(item, MaterializedRow) else item
        try:
            body: dict[str, Any] = orjson.loads(orjson.dumps(source))
        except TypeError as exc:
            raise InputError(
                [f"rows[{index}] is not JSON ({exc}); rows must be JSON objects"]
            ) from exc
        if not isinstance(body, dict):
            raise InputError([f"rows[{index}] is a {type(body).__name__}, not a JSON object"])
        key = (body.get(TASK_INDEX), body.get(ROLLOUT_INDEX))
        if not all(type(i) is int and i >= 0 for i in key):
            raise InputError(
                [
                    f"rows[{index}] has no {TASK_INDEX} and {ROLLOUT_INDEX} (got {key[0]!r}, "
                    f"{key[1]!r}); plan the rows with trollout.plan_rows(rows, config, "
                    "deployment) first, or feed back rows a batch returned"
                ]
            )
        came_from = body.get(RUN_ID) if isinstance(body.get(RUN_ID), str) else None
        earlier = self._keys.get(key)  # type: ignore[arg-type]
        if earlier is not None:
            raise InputError([_repeated(index, came_from, *earlier, key)])
        self._keys[key] = (index, came_from)  # type: ignore[index]
        body[ROLLOUT_ID] = shard_rollout_id(body, self.run_id)
        body[RUN_ID] = self.run_id
        return MaterializedRow.from_body(body)

    def all(self, rows: BatchRows) -> Iterator[MaterializedRow]:
        """Stamp rows one by one as they are read."""
        for index, item in enumerate(rows):
            yield self(item, index)

    def stamp_all(self, rows: BatchRows) -> StampedRows:
        """Stamp every row now; a batch of this run id dispatches the result as it is."""
        return StampedRows(self.all(rows), self.run_id)


class StampedRows(tuple[MaterializedRow, ...]):
    """Rows one `RowStamper` copied and stamped for run ``run_id``, each (task, rollout) once
    (module docstring); made only by `RowStamper.stamp_all`."""

    run_id: str

    def __new__(cls, rows: Iterable[MaterializedRow], run_id: str) -> StampedRows:
        made = super().__new__(cls, rows)
        made.run_id = run_id
        return made


def _repeated(
    index: int, came_from: str | None, first: int, first_from: str | None, key: tuple[Any, Any]
) -> str:
    """Say why ``rows[index]`` repeats the numbers of ``rows[first]``, and what to do."""

    def origin(run: str | None) -> str:
        return "planned anew" if run is None else f"fed back from batch {run!r}"

    what = (
        f"rows[{index}] ({origin(came_from)}) has the task and rollout numbers of rows[{first}] "
        f"({origin(first_from)}): task {key[0]} rollout {key[1]}; each rollout may appear "
        "once per batch"
    )
    if came_from is not None and came_from == first_from:
        return f"{what}; the same returned row was given twice: feed it back once"
    if came_from is None and first_from is None:
        return (
            f"{what}; rows planned by separate calls are numbered apart by one Rollouts' plan "
            "(each call continues its numbering) or by plan_rows(..., start_task_index=N) "
            "past the other call's tasks, and a row meant to run several times is planned "
            "once with num_repeats"
        )
    return (
        f"{what}; plan the fresh rows with the Rollouts that planned the fed-back ones (its "
        "plan numbers each call after every task it planned), or pass start_task_index= past "
        "the fed-back rows' highest _ng_task_index"
    )
