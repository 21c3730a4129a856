"""The batch status: each rollout's latest state, the counts, and ``<stem>_batch_status.json``.

The store (`store.RunStore`) keeps, per rollout that has an outcome but has not landed, its
latest `RolloutStatus` (`status_of`), under a compact key (`rollout_key`); `build_status` counts
them into a `BatchStatus`, and `write_status_file` replaces the file atomically. Resume reads
the same keys (`resume`, `run_files`).

Its own module, apart from the store's life cycle (start, append, fsync, failure): how a status
is counted is read and tested alone, and the resume side needs the keys without the store.
"""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import TypeAlias

import orjson

from ..records import (
    BatchStatus,
    Failed,
    FailureClass,
    Identity,
    OmitReason,
    Omitted,
    RolloutState,
    RolloutStatus,
    converter,
)
from .files import replace_atomically

__all__ = [
    "RolloutKey",
    "build_status",
    "identity_key",
    "never_started",
    "rollout_key",
    "save_status",
    "status_of",
    "write_status_file",
]

# A landed key packs (task, rollout) into one int; a tuple for indices outside the packed range.
RolloutKey: TypeAlias = int | tuple[int, int]
_ROLLOUT_BITS = 32
_ROLLOUT_LIMIT = 1 << _ROLLOUT_BITS
_DRAINED = OmitReason.DRAINED.value  # the kind of a never-started attempt's status


def build_status(
    expected: int, completed: int, pending: list[RolloutStatus], closed: bool
) -> BatchStatus:
    """Count the rollouts by latest state; the rest of ``expected`` never started (nothing of
    them reached the store, or only a drained attempt), so the counts sum to ``expected``."""
    pending.sort(key=lambda s: (s.task_index, s.rollout_index))
    states = collections.Counter(s.state for s in pending)
    classes = collections.Counter(
        s.failure_class or "" for s in pending if s.state is RolloutState.FAILED
    )
    drained = sum(1 for s in pending if s.state is RolloutState.OMITTED and s.kind == _DRAINED)
    omitted = states[RolloutState.OMITTED] - drained
    settled = completed + states[RolloutState.FAILED] + states[RolloutState.NO_PERSIST] + omitted
    not_started = max(0, expected - settled)
    return BatchStatus(
        expected=expected,
        completed=completed,
        failed=states[RolloutState.FAILED],
        no_persist=states[RolloutState.NO_PERSIST],
        omitted=omitted,
        not_started=not_started,
        failures_by_class=dict(sorted(classes.items())),
        finished=closed and not_started == 0,
        closed=closed,
        updated_at=time.time(),
        rollouts=tuple(pending),
    )


def save_status(
    path: Path,
    expected: int,
    completed: int,
    pending: list[RolloutStatus],
    closed: bool,
    *,
    durable: bool = True,
) -> None:
    """Count the rollouts (`build_status`) and replace the status file."""
    write_status_file(path, build_status(expected, completed, pending, closed), durable=durable)


def write_status_file(path: Path, status: BatchStatus, *, durable: bool = True) -> None:
    """Replace the status file atomically with ``status`` (``durable``: and fsync it)."""
    data = orjson.dumps(converter.unstructure(status), option=orjson.OPT_INDENT_2)
    replace_atomically(path, [data, b"\n"], durable=durable)


def identity_key(identity: Identity) -> RolloutKey:
    """Return the compact key of a rollout's identity (`rollout_key`)."""
    return rollout_key(identity.task_index, identity.rollout_index)


def rollout_key(task: int, rollout: int) -> RolloutKey:
    """Return the compact key of a rollout (one int when the indices fit, else a tuple)."""
    if task >= 0 and 0 <= rollout < _ROLLOUT_LIMIT:
        return task << _ROLLOUT_BITS | rollout
    return (task, rollout)


def never_started(outcome: Failed | Omitted) -> bool:
    """Whether the attempt never reached a server (its status does not replace an earlier one)."""
    if isinstance(outcome, Omitted):
        return outcome.reason is OmitReason.DRAINED
    return not outcome.spends_attempt


def status_of(outcome: Failed | Omitted) -> RolloutStatus:
    """Return the status a failed or omitted outcome leaves its rollout in."""
    ident = outcome.identity
    if type(outcome) is Failed:
        state = RolloutState.NO_PERSIST if outcome.no_persist else RolloutState.FAILED
        return RolloutStatus(
            task_index=ident.task_index,
            rollout_index=ident.rollout_index,
            attempt_index=outcome.attempt_index,
            state=state,
            agent_name=ident.agent_name,
            failure_class=outcome.failure_class,
            kind=outcome.kind,
            terminal=outcome.terminal,
        )
    assert type(outcome) is Omitted
    return RolloutStatus(
        task_index=ident.task_index,
        rollout_index=ident.rollout_index,
        attempt_index=outcome.attempt_index,
        state=RolloutState.OMITTED,
        agent_name=ident.agent_name,
        failure_class=FailureClass.CANCELLED.value,
        kind=outcome.reason.value,
    )
