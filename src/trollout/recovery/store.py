"""The run folder's only writer: appends outcome rows, fsyncs them, and saves progress.

`open_run_store` takes the folder's cross-process lock, clears the old files of a fresh run (or
repairs torn tails when resuming), and yields a `RunStore`, the `OutcomeSink` the engine's single
writer task feeds. Each batch becomes at most one ``write(2)`` per file: landed rows to the
rollouts file, failures to the sidecar (kill-shaped ``no_persist`` failures nowhere), omitted
attempts nowhere unless ``record_omitted_rollouts``. A rollout lands at most once per store: a
second `Landed` for a landed (task, rollout) is refused and counted, never written.

Attempts: the store is also the engine's `AttemptReserver`: `RunStore.reserve` appends each
batch of attempt numbers to the ledger (`ledger`) before the engine sends any of them. Resume:
a non-fresh store writes no status until `RunStore.seed` hands it what the folder holds
(landed keys, latest states, the whole run's ``expected``), so a refused resume leaves the
folder byte for byte as it was, and a resumed one reports the whole run.

Durability: rows are written with plain ``os.write`` on the event loop (they land in the page
cache, so they survive the process being killed), and ``fsync`` follows `RunConfig.fsync`: after
every batch (``row``: each acknowledged row is on disk when `write` returns), when
``fsync_every_rows`` rows or ``fsync_every_s`` seconds have gone unsynced (``batch``), or never.
fsync and the status file run in a worker thread so the event loop keeps serving rollouts. The
batch status is replaced atomically (temp file, fsync, rename, fsync the folder) at most every
``status_interval_s`` and once at close with ``finished=True``.

Design note: time-driven work (an fsync that is due although no new batch arrives, a status
update after a quiet spell) is checked on every `write` and, when the caller runs it,
by `RunStore.run_housekeeping` in the caller's nursery. The store does not open a nursery of its
own inside `open_run_store`: a context manager that yields inside a nursery wraps every
exception of its body in an ``ExceptionGroup``, which would turn a plain error of the engine into
a group. Rejected as well: a ``BufferedWriter`` per file (a buffer would hold acknowledged rows in
user space, where a kill loses them) and fsync on the event loop (one fsync costs as much as
hundreds of rollouts' bookkeeping).

Memory: the set of landed keys (one int per landed rollout) plus the latest `RolloutStatus` of
every rollout that has an outcome but has not landed.

Length: this module runs past the house's ~400 lines because the sink, its append/fsync file
helpers and the status bookkeeping were assigned as one file; the file helpers (`Appender`,
`replace_atomically`, the fsync functions) would split off cleanly into a ``recovery/files.py``.
"""

from __future__ import annotations

import collections
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeAlias, TypeVar

import orjson
import trio
from attrs import frozen

from .. import jsonl
from ..config import FsyncPolicy, RunConfig
from ..errors import RunFolderError
from ..records import (
    FAILURE_MAX_ATTEMPTS,
    BatchStatus,
    Failed,
    FailureClass,
    Identity,
    Landed,
    MaterializedRow,
    OmitReason,
    Omitted,
    Outcome,
    RolloutState,
    RolloutStatus,
    converter,
    outcome_to_row,
)
from .files import (
    Appender,
    fsync_all,
    fsync_dir,
    os_errors,
    remove_temp_files,
    replace_atomically,
    write_materialized,
)
from .layout import RunLayout
from .ledger import encode_reservation
from .lock import RunLock

__all__ = ["RunStore", "StoreCounts", "open_run_store", "rollout_key"]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")
# A landed key packs (task, rollout) into one int; a tuple for indices outside the packed range.
_Key: TypeAlias = int | tuple[int, int]
_ROLLOUT_BITS = 32
_ROLLOUT_LIMIT = 1 << _ROLLOUT_BITS
REMEDY = "check free space and permissions of the folder, then resume the run"


@frozen
class StoreCounts:
    """What a store wrote, for the engine's final summary.

    Attributes:
        expected: rollouts the run was asked for.
        landed: rollouts landed (rows in the rollouts file written by this store).
        failed: rollouts whose latest outcome is a written failure.
        no_persist: rollouts whose latest outcome was kill-shaped (written nowhere).
        omitted: rollouts whose latest attempt was interrupted or drained.
        failure_rows: rows appended to the sidecar (one per failed attempt, plus omitted rows).
        duplicates_refused: landed outcomes refused because the rollout had already landed.
        failures_by_class: ``failed`` counted by failure class.
    """

    expected: int
    landed: int
    failed: int
    no_persist: int
    omitted: int
    failure_rows: int
    duplicates_refused: int
    failures_by_class: dict[str, int]


@asynccontextmanager
async def open_run_store(
    layout: RunLayout,
    config: RunConfig,
    *,
    expected: int,
    fresh: bool = True,
    max_close_s: float = 30.0,
) -> AsyncIterator[RunStore]:
    """Own a run folder for one run: lock it, prepare it, and yield its store.

    Args:
        layout: the run folder's file names.
        config: fsync policy, status interval and ``record_omitted_rollouts``.
        expected: rollouts the run was asked for (the status file's ``expected``).
        fresh: clear every file of the run first; False keeps them and repairs torn tails,
            and the store then saves no status until `RunStore.seed` (or `RunStore.reset`)
            says what the run holds, so a resume that is refused leaves the folder as it was.
        max_close_s: bound on the final flush at exit, which runs shielded from cancellation.

    Raises:
        RunFolderLockedError: another collector owns the folder.
        RunFolderError: the folder cannot be created, cleared or written.

    Cancellation: entering does no checkpoint. Exit is shielded (up to ``max_close_s``): every
    row `write` accepted is fsynced (unless the policy is ``never``) and the final status is
    written even when the surrounding scope is cancelled; the lock is released last.
    """
    with os_errors(layout.output.parent, "create the run folder"):
        layout.output.parent.mkdir(parents=True, exist_ok=True)
    with RunLock.for_layout(layout):
        store = RunStore(layout, config, expected=expected)
        try:
            store._prepare(fresh=fresh)
        except BaseException:
            store._close_files()
            raise
        try:
            yield store
        finally:
            with trio.move_on_after(max_close_s, shield=True):
                await store.aclose()
            store._close_files()


class RunStore:
    """The `OutcomeSink` that appends outcomes to a run folder; open with `open_run_store`."""

    def __init__(self, layout: RunLayout, config: RunConfig, *, expected: int) -> None:
        """Set up an unopened store; `open_run_store` locks and prepares it."""
        self.layout = layout
        self.config = config
        self.expected = expected
        self._rollouts = Appender(layout.rollouts)
        self._failures = Appender(layout.failures)
        self._ledger = Appender(layout.attempts)
        self._status_enabled = True
        self._landed: set[_Key] = set()
        self._pending: dict[_Key, RolloutStatus] = {}
        self._failure_rows = 0
        self._duplicates = 0
        self._unsynced_rows = 0
        self._unsynced_since: float | None = None
        self._status_dirty = False
        self._status_at = -math.inf
        # The writer and the housekeeping task may both reach for a file; these keep each file
        # operation whole (one fsync round, one status replace) and let close wait for them.
        self._sync_lock = trio.Lock()
        self._status_lock = trio.Lock()
        self._changed = trio.Event()
        self._housekeeping = False
        self._closed = False

    # --- public API ---------------------------------------------------------------------------

    @property
    def counts(self) -> StoreCounts:
        """Return what the store has written so far (O(rollouts not landed))."""
        status = self.snapshot()
        return StoreCounts(
            expected=self.expected,
            landed=status.completed,
            failed=status.failed,
            no_persist=status.no_persist,
            omitted=status.omitted,
            failure_rows=self._failure_rows,
            duplicates_refused=self._duplicates,
            failures_by_class=status.failures_by_class,
        )

    def snapshot(self, *, finished: bool = False) -> BatchStatus:
        """Return the batch status as of now (what the status file would hold)."""
        return _build_status(
            self.expected, len(self._landed), list(self._pending.values()), finished
        )

    async def write_materialized_inputs(self, rows: Iterable[MaterializedRow]) -> int:
        """Write the materialized-inputs file atomically and fsync it; return the row count.

        ``rows`` is consumed in a worker thread (streaming: memory does not grow with it), so it
        must not touch Trio. The file appears complete or not at all.

        Cancellation: a checkpoint before the thread starts; once started, the write runs to
        the end (a cancellation then takes effect at the caller's next checkpoint). Safe to retry.
        """
        self._check_open()
        return await _off_loop(write_materialized, self.layout.materialized_inputs, rows)

    def seed(self, *, expected: int, landed: set[_Key], statuses: Iterable[RolloutStatus]) -> None:
        """Start a resumed store from what the run folder already holds.

        Args:
            expected: rollouts of the whole run.
            landed: keys (`rollout_key`) of the rollouts already landed; taken, not copied.
            statuses: the latest state of rollouts that have an outcome but have not landed.

        From then on the counts and the status file cover the whole run, and a landed rollout
        is refused a second row even when this session never saw it land.
        """
        self.expected = expected
        self._landed = landed
        self._pending = {rollout_key(s.task_index, s.rollout_index): s for s in statuses}
        self._status_enabled = True
        self._status_dirty = True

    def reset(self, *, expected: int) -> None:
        """Clear every file of the run, as a fresh store does (under the lock, before writing)."""
        self._check_open()
        self._rollouts.close()
        self._failures.close()
        self._ledger.close()
        self.expected = expected
        self._landed, self._pending = set(), {}
        self._prepare(fresh=True)
        self._status_enabled = True

    async def reserve(self, attempts: Sequence[tuple[Identity, int]]) -> None:
        """Put a batch of attempt numbers in the ledger before they are sent (`AttemptReserver`).

        One ``write(2)`` per batch, then an fsync (in a worker thread) unless the policy is
        ``never``: the numbers survive a SIGKILL as soon as the write returns, and a power
        loss once the fsync has.

        Raises:
            RunFolderError: the ledger cannot be written.

        Cancellation: a checkpoint (during the fsync); if cancelled, the numbers may be on
        record but nothing was sent, which is safe: resume skips them, it never reuses them.
        """
        self._check_open()
        line = encode_reservation(
            [(i.task_index, i.rollout_index, attempt) for i, attempt in attempts]
        )
        self._ledger.append(line)
        if self.config.fsync is not FsyncPolicy.NEVER:
            fds: list[int | None] = [self._ledger.sync_target()]
            if self._ledger.created:
                self._ledger.created = False
                fds.append(None)
            with os_errors(self._ledger.path, "fsync"):
                await _off_loop(fsync_all, fds, self.layout.output.parent)

    async def write(self, outcomes: Sequence[Outcome]) -> None:
        """Append a batch of outcomes to the run folder, then fsync per the policy.

        Raises:
            RunFolderError: a file cannot be written (disk full, permissions).

        Cancellation: the rows are written before the first checkpoint; a cancellation during
        the fsync or status update that follows leaves them written but perhaps not yet synced
        (`aclose` syncs them). Not safe to retry: the batch is already written. The engine calls
        this inside a shielded scope.
        """
        self._check_open()
        landed, failures, changes = self._encode(outcomes)
        self._append(landed, failures)
        self._apply(changes)
        policy = self.config.fsync
        if policy is FsyncPolicy.ROW or (
            policy is FsyncPolicy.BATCH and self._unsynced_rows >= self.config.fsync_every_rows
        ):
            await self._sync()
        if not self._housekeeping:
            await self._tick()

    async def run_housekeeping(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Fsync and save the status when they fall due between batches, until closed.

        Optional: without it, `write` does the due work itself (so a quiet spell delays it
        until the next batch or `aclose`); with it, `write` never waits for a status save. It
        returns when the store closes, so it may run in a nursery around the store's block.

        Cancellation: cancel it to stop; an fsync or status write in progress completes first.
        """
        self._housekeeping = True
        task_status.started()
        try:
            while not self._closed:
                with trio.move_on_at(min(self._fsync_due(), self._status_due())):
                    await self._changed.wait()
                self._changed = trio.Event()
                if not self._closed:
                    await self._tick()
        finally:
            self._housekeeping = False

    async def aclose(self) -> None:
        """Fsync what is written, save the final status (``finished=True``), close the files.

        `open_run_store` calls this at exit under a shielded scope; calling it twice is harmless.

        Cancellation: a checkpoint; if cancelled, the files are still closed, but the final
        fsync or status may be missing (the rows themselves are already written).
        """
        if self._closed:
            return
        try:
            if self.config.fsync is not FsyncPolicy.NEVER:
                await self._sync()
            if self._status_enabled:
                await self._write_status(finished=True)
        finally:
            self._close_files()

    # --- opening ------------------------------------------------------------------------------

    def _prepare(self, *, fresh: bool) -> None:
        """Clear (fresh) or repair (resume) the run's files, then open the rollouts file."""
        remove_temp_files(self.layout)
        if fresh:
            for path in self.layout.all_files():
                with os_errors(path, "clear"):
                    path.unlink(missing_ok=True)
            with os_errors(self.layout.batch_status, "save the batch status"):
                _write_status_file(self.layout.batch_status, self.snapshot())
            self._status_at = trio.current_time()
        else:
            self._status_enabled = False  # until seed() or reset() says what the run holds
            for path in (self.layout.rollouts, self.layout.failures, self.layout.attempts):
                with os_errors(path, "repair the tail of"):
                    jsonl.repair_tail(path)
        self._rollouts.open()
        self._rollouts.created = False
        fsync_dir(self.layout.output.parent)

    def _check_open(self) -> None:
        if self._closed:
            raise RunFolderError(
                f"the run store of {str(self.layout.output)!r} is closed; write before leaving "
                "open_run_store's block"
            )

    def _close_files(self) -> None:
        self._closed = True
        self._changed.set()
        self._rollouts.close()
        self._failures.close()
        self._ledger.close()

    # --- writing ------------------------------------------------------------------------------

    def _encode(
        self, outcomes: Sequence[Outcome]
    ) -> tuple[list[bytes], list[bytes], list[tuple[_Key, RolloutStatus | None, bool]]]:
        """Serialize a batch: landed lines, sidecar lines, and the status change of each."""
        landed: list[bytes] = []
        failures: list[bytes] = []
        changes: list[tuple[_Key, RolloutStatus | None, bool]] = []
        batch: set[_Key] = set()
        for outcome in outcomes:
            key = _key(outcome.identity)
            if type(outcome) is Landed:
                if key in self._landed or key in batch:
                    self._refuse(outcome)
                    continue
                batch.add(key)
                landed.append(jsonl.dumps(outcome_to_row(outcome)))
                changes.append((key, None, True))
            else:
                assert isinstance(outcome, Failed | Omitted)
                if self._persists(outcome):
                    failures.append(jsonl.dumps(self._failure_row(outcome)))
                changes.append((key, _status_of(outcome), not _never_started(outcome)))
        return landed, failures, changes

    def _failure_row(self, outcome: Failed | Omitted) -> dict[str, object]:
        row = outcome_to_row(outcome)
        if type(outcome) is Failed:
            row[FAILURE_MAX_ATTEMPTS] = self.config.max_attempts  # the cap resume applies
        return row

    def _persists(self, outcome: Failed | Omitted) -> bool:
        if type(outcome) is Failed:
            return not outcome.no_persist
        return self.config.record_omitted_rollouts

    def _refuse(self, outcome: Landed) -> None:
        self._duplicates += 1
        _log.warning(
            "refused a second landed row for task %d rollout %d (attempt %d) in %r: the rollout "
            "already landed in this run",
            outcome.identity.task_index,
            outcome.identity.rollout_index,
            outcome.attempt_index,
            str(self.layout.output),
        )

    def _append(self, landed: list[bytes], failures: list[bytes]) -> None:
        if landed:
            self._rollouts.append(b"".join(landed))
        if failures:
            self._failures.append(b"".join(failures))
            self._failure_rows += len(failures)
        rows = len(landed) + len(failures)
        if rows and self._unsynced_since is None:
            self._unsynced_since = trio.current_time()
            self._changed.set()
        self._unsynced_rows += rows

    def _apply(self, changes: list[tuple[_Key, RolloutStatus | None, bool]]) -> None:
        for key, status, supersedes in changes:
            if status is None:
                self._landed.add(key)
                self._pending.pop(key, None)
            elif key not in self._landed and (supersedes or key not in self._pending):
                self._pending[key] = status
        if changes and not self._status_dirty:
            self._status_dirty = True
            self._changed.set()

    # --- time-driven work ---------------------------------------------------------------------

    def _fsync_due(self) -> float:
        if self.config.fsync is not FsyncPolicy.BATCH or self._unsynced_since is None:
            return math.inf
        return self._unsynced_since + self.config.fsync_every_s

    def _status_due(self) -> float:
        return self._status_at + self.config.status_interval_s if self._status_dirty else math.inf

    async def _tick(self) -> None:
        if self._fsync_due() <= trio.current_time():
            await self._sync()
        if self._status_due() <= trio.current_time():
            await self._write_status()

    async def _sync(self) -> None:
        """Fsync every file with unsynced rows (and the folder after a file was created)."""
        async with self._sync_lock:
            files = [a for a in (self._rollouts, self._failures) if a.dirty]
            if not files or self._closed:
                return
            fds: list[int | None] = [a.sync_target() for a in files]
            if any(a.created for a in files):
                fds.append(None)  # the folder: a new file's name must survive a crash too
            for a in files:
                a.dirty = a.created = False
            self._unsynced_rows, self._unsynced_since = 0, None
            with os_errors(self.layout.output, "fsync the run files of"):
                await _off_loop(fsync_all, fds, self.layout.output.parent)

    async def _write_status(self, *, finished: bool = False) -> None:
        if not self._status_enabled:
            return
        async with self._status_lock:
            if not finished and (self._closed or self._status_due() > trio.current_time()):
                return  # written (or closed) by the other task while this one waited
            # Copy the state on the loop; sorting and serializing happen in the thread.
            args = (self.expected, len(self._landed), list(self._pending.values()), finished)
            self._status_dirty, self._status_at = False, trio.current_time()
            path = self.layout.batch_status
            with os_errors(path, "save the batch status"):
                await _off_loop(_save_status, path, *args)


# --- helpers (sync: they run in worker threads) ---------------------------------------------------


async def _off_loop(fn: Callable[..., _T], *args: object) -> _T:
    """Run blocking file work in a worker thread (tests replace this to stay on the fake clock)."""
    return await trio.to_thread.run_sync(fn, *args)


def _build_status(
    expected: int, completed: int, pending: list[RolloutStatus], finished: bool
) -> BatchStatus:
    pending.sort(key=lambda s: (s.task_index, s.rollout_index))
    states = collections.Counter(s.state for s in pending)
    classes = collections.Counter(
        s.failure_class or "" for s in pending if s.state is RolloutState.FAILED
    )
    return BatchStatus(
        expected=expected,
        completed=completed,
        failed=states[RolloutState.FAILED],
        no_persist=states[RolloutState.NO_PERSIST],
        omitted=states[RolloutState.OMITTED],
        failures_by_class=dict(sorted(classes.items())),
        finished=finished,
        updated_at=time.time(),
        rollouts=tuple(pending),
    )


def _save_status(
    path: Path, expected: int, completed: int, pending: list[RolloutStatus], finished: bool
) -> None:
    _write_status_file(path, _build_status(expected, completed, pending, finished))


def _write_status_file(path: Path, status: BatchStatus) -> None:
    data = orjson.dumps(converter.unstructure(status), option=orjson.OPT_INDENT_2)
    replace_atomically(path, [data, b"\n"])


def _key(identity: Identity) -> _Key:
    return rollout_key(identity.task_index, identity.rollout_index)


def rollout_key(task: int, rollout: int) -> _Key:
    """Return the compact key of a rollout (one int when the indices fit, else a tuple)."""
    if task >= 0 and 0 <= rollout < _ROLLOUT_LIMIT:
        return task << _ROLLOUT_BITS | rollout
    return (task, rollout)


def _never_started(outcome: Failed | Omitted) -> bool:
    """Whether the attempt never reached a server (its status does not replace an earlier one)."""
    if isinstance(outcome, Omitted):
        return outcome.reason is OmitReason.DRAINED
    return not outcome.spends_attempt


def _status_of(outcome: Failed | Omitted) -> RolloutStatus:
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
