# Stays whole: the sink's life cycle (start, append, fsync, status, failure) acts on one set of
# state; file operations live in `files`, the batch status in `status`.
"""The run folder's only writer: appends outcome rows, fsyncs them, and saves progress.

`open_run_store` checks the folder (`preflight`: no symlinked or special run files; a folder that
holds a run is replaced only on ``overwrite``), takes its cross-process lock and yields a
`RunStore`, the `OutcomeSink` the engine's single writer task feeds. Each batch becomes at most
one ``write(2)`` per file: landed rows to the rollouts file, failures to the sidecar
(kill-shaped ``no_persist`` failures nowhere), omitted attempts nowhere unless
``record_omitted_rollouts``. A rollout lands at most once per store: a second `Landed` for a
landed (task, rollout) is refused and counted, never written.

Starting, and never destroying early: a store writes nothing until its run starts. A fresh run
starts in `RunStore.write_materialized_inputs`, which removes an old run's files (``overwrite``)
only once the new inputs are complete on disk, so a run refused, failing or interrupted before
then leaves the old run whole, and a new folder holds no run (its lock file aside); a fresh run
in a new folder fed no inputs (a driver recording outcomes alone) starts at its first outcome;
a resume starts in `RunStore.seed`, after the caller's checks, which repairs torn tails and hands
the store what the folder holds (landed keys, latest states, the whole run's ``expected``), so a
refused resume leaves the folder byte for byte as it was, and a resumed one reports the whole run.
Temp files a crash left are removed when the run starts: by a resume always, by a fresh start
when the lock held a dead writer's record (`lock.RunLock.inherited`: only a writer that died
holding the lock can have left one, and a shards folder is too big to list at every step).

Attempts: the store is also the engine's `AttemptReserver`: `RunStore.reserve` appends the
number of each attempt a worker is about to send to the ledger (`ledger`), and `write` appends a
release line for the attempts of a batch that never reached a server (drained, ``not_sent``), so
resume hands those numbers out again. The ledger is fsynced with the outcome files, per the
policy: before `reserve` returns under ``row``, within ``fsync_every_s`` under ``batch``.

Failure: a write the OS refuses mid-run (disk full, quota, I/O error) raises
`RunFolderWriteError`, naming the file and the free space; what that call appended is cut away,
and from then on the store writes nothing (every call raises the same error, close writes no
status), so the folder holds no torn row and a resume picks up where the disk gave out.

Durability: rows are written with plain ``os.write`` on the event loop (they land in the page
cache, so they survive the process being killed), and ``fsync`` follows `RunConfig.fsync`: after
every batch (``row``: each acknowledged row is on disk when `write` returns), when
``fsync_every_rows`` rows or ``fsync_every_s`` seconds have gone unsynced (``batch``), or never.
``never`` means nothing at all: the materialized inputs, the manifest and the status are
replaced atomically but not fsynced either (`RunStore.durable`), so a run under ``never`` (a
trainer recording a shard per step, which replays a step a power loss cut) pays no fsync; a
kill loses nothing, a power loss may leave files that resume refuses, naming them.
fsync and the status file run in a worker thread so the event loop keeps serving rollouts. The
batch status is replaced atomically (temp file, fsync, rename, fsync the folder) at most every
``status_interval_s`` and once at close with ``closed=True`` (``finished`` too when every
expected rollout has an outcome: the status counts the rest as ``not_started``, so a batch cut
early or a run stopped before its end never reads as done). At close, the last fsync and the
final status are one worker-thread job, the fsync first: a thread hop costs about 0.1 ms of
CPU, which a training step's shard (a store opened and closed per step) paid twice.

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
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import trio
from attrs import frozen

from .. import jsonl
from ..errors import RunFolderError, RunFolderWriteError
from ..records import (
    FAILURE_MAX_ATTEMPTS,
    BatchStatus,
    Failed,
    Identity,
    Landed,
    MaterializedRow,
    Omitted,
    Outcome,
    RolloutStatus,
    outcome_to_row,
)
from ..settings import FsyncPolicy, RunConfig
from . import status as status_file  # its functions looked up when called (tests replace them)
from .files import (
    Appender,
    fsync_all,
    fsync_dir,
    os_errors,
    remove_temp_files,
    write_materialized,
)
from .layout import RunLayout
from .ledger import encode_release, encode_resend, encode_reservation
from .lock import RunLock
from .manifest import FolderState, folder_state
from .preflight import check_fresh, check_run_folder, check_run_paths
from .status import (
    RolloutKey,
    build_status,
    identity_key,
    never_started,
    rollout_key,
    status_of,
)

__all__ = ["RunStore", "StoreCounts", "check_run_folder", "open_run_store"]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")
_STOP_WAIT_S = 10.0  # how long a cancelled whole-file write may take to stop and clean up
# `status.save_status`'s arguments: expected, completed, pending, closed.
_StatusArgs = tuple[int, int, list[RolloutStatus], bool]


@frozen
class StoreCounts:
    """What a store wrote, for the engine's final summary.

    Attributes:
        expected: rollouts the run was asked for.
        landed: rollouts landed (rows in the rollouts file written by this store).
        failed: rollouts whose latest outcome is a written failure.
        no_persist: rollouts whose latest outcome was kill-shaped (written nowhere).
        omitted: rollouts whose latest attempt was interrupted in flight.
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
    """Own a run folder for one run: check it, lock it, and yield its store.

    Nothing in the folder is removed or rewritten until the run provably starts: a fresh run
    over a folder that holds a run (allowed by ``config.overwrite``) replaces it only once
    `RunStore.write_materialized_inputs` has written the new inputs completely, so a run refused
    or interrupted before that leaves the old one as it was; a resumed run repairs torn tails
    only in `RunStore.seed`, after the caller's checks passed, so a refused resume leaves the
    folder byte for byte as it was. A fresh run in a folder that holds no run starts the same
    way, with its inputs (interrupted before, the folder holds only the lock file, which is
    never unlinked), or at its first outcome when it has none.

    Args:
        layout: the run folder's file names.
        config: fsync policy, status interval, ``record_omitted_rollouts`` and ``overwrite``.
        expected: rollouts the run was asked for (the status file's ``expected``).
        fresh: start a new run; a folder that already holds one (a manifest or outcome rows)
            is refused unless ``config.overwrite``. False opens the folder for a resume: the
            store then writes nothing until `RunStore.seed` (or, in a folder that holds no
            run, `RunStore.write_materialized_inputs`) starts it.
        max_close_s: bound on the final flush at exit, which runs shielded from cancellation.

    Raises:
        RunFolderLockedError: another collector owns the folder.
        RunFolderError: a run file is a symlink or not a regular file; the input is one of the
            run's files; the folder holds a run and neither resume nor overwrite was asked;
            the folder cannot be created (`check_run_folder`).

    Cancellation: entering does no checkpoint. Exit is shielded (up to ``max_close_s``): every
    row `write` accepted is fsynced (unless the policy is ``never``) and the final status is
    written even when the surrounding scope is cancelled; the lock is released last.
    """
    check_run_folder(layout, config, fresh=fresh)  # before mkdir and lock: nothing touched
    with os_errors(layout.output.parent, "create the run folder"):
        layout.output.parent.mkdir(parents=True, exist_ok=True)
    with RunLock.for_layout(layout) as lock:
        check_run_paths(layout)  # again under the lock: another process may have been first
        store = RunStore(layout, config, expected=expected, lock=lock)
        try:
            store._open(fresh=fresh)
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

    def __init__(
        self, layout: RunLayout, config: RunConfig, *, expected: int, lock: RunLock | None = None
    ) -> None:
        """Set up an unopened store; `open_run_store` locks and prepares it."""
        self.layout = layout
        self._lock = lock  # checked before each append: still this writer's folder
        self.config = config
        self.expected = expected
        # The sha256 of the materialized inputs this store wrote (None: it wrote none).
        self.materialized_sha256: str | None = None
        self._rollouts = Appender(layout.rollouts)
        self._failures = Appender(layout.failures)
        self._ledger = Appender(layout.attempts)
        self._status_enabled = False  # until the run starts (fresh, seeded or replaced)
        self._may_replace = False  # a new run's inputs may replace what the folder holds
        self._may_start_bare = False  # a fresh run in a new folder: its first outcome starts it
        self._started = False
        self._failure: RunFolderWriteError | None = None
        self._landed: set[RolloutKey] = set()
        self._pending: dict[RolloutKey, RolloutStatus] = {}
        self._reserved = 0  # reservation lines appended (``row``: fsynced up to _reserved_synced)
        self._reserved_synced = 0
        self._fsync_each = config.fsync is FsyncPolicy.ROW  # a reservation waits for its fsync
        # Under ``never`` nothing is fsynced: rows, inputs, manifest, status (module docstring).
        self.durable = config.fsync is not FsyncPolicy.NEVER
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

    def has_outcome(self, identity: Identity) -> bool:
        """Whether the rollout has an outcome in this store (landed, or a latest state)."""
        key = identity_key(identity)
        return key in self._landed or key in self._pending

    def snapshot(self, *, finished: bool = False) -> BatchStatus:
        """Return the batch status as of now (what the status file would hold)."""
        return build_status(
            self.expected, len(self._landed), list(self._pending.values()), finished
        )

    async def write_materialized_inputs(
        self,
        rows: Iterable[MaterializedRow | Mapping[str, Any]],
        *,
        then: Callable[[str], None] | None = None,
    ) -> int:
        """Write the materialized-inputs file atomically and fsync it; return the row count.

        ``rows`` (the rows, or their bodies: a plan's ``bodies()``) is consumed in a worker
        thread (streaming: memory does not grow with it), so it must not touch Trio. The file
        appears complete or not at all. In a store that has not started yet (a fresh run, or a
        resume of a folder holding no run), this starts the run: once the new inputs are
        complete and synced, and only then, the old run's files (if any) are removed, the new
        (empty) rollouts file is created and the new inputs take their place; the folder's fsync
        after that rename makes the rollouts file's name durable too (inputs kept in another
        folder: the output's folder is fsynced before the rename). The first status is saved
        ``status_interval_s`` later, or at close if that comes first (a shard's step).

        Args:
            rows: the materialized rows.
            then: called in the same worker thread once the inputs are in place, with their
                sha256 (a new run's manifest is written there: a thread hop costs about 0.1 ms
                of CPU, once per shard); not called when the caller was cancelled meanwhile.
                What it raises is raised here, once the store has started as without it.

        Raises:
            RunFolderError: the file cannot be written, or the store is resuming a folder that
                holds a run (a resume dispatches the saved inputs; it never replaces them).

        Cancellation: a checkpoint; cancelling (Ctrl-C included) stops the writer thread at its
        next row, removes its temp file and leaves the folder as it was. Safe to retry.
        """
        self._check_open()
        path = self.layout.materialized_inputs
        digest = hashlib.sha256()
        if self._started:
            count, failed = await _off_loop_stoppable(
                _write_inputs, path, rows, digest=digest, then=then, durable=self.durable
            )
            if failed is not None:
                raise failed
            return count
        if not self._may_replace:
            raise RunFolderError(
                f"{str(self.layout.output)!r} holds a run being resumed; its materialized inputs "
                "are what it dispatches and are never replaced; collect into a new output file"
            )

        def replace(temp: Path) -> None:  # in the worker thread, the new inputs complete
            _clear_run_files(self.layout, temp, temps=self._leftovers())
            self._leftovers_removed()
            # Before the rename, whose folder fsync covers its name. Closed first: an earlier
            # try that failed after this point left its descriptor on the file just removed.
            self._rollouts.close()
            self._rollouts.open()
            if self.layout.relocated and self.durable:  # that fsync is of another folder
                fsync_dir(self.layout.output.parent)

        count, failed = await _off_loop_stoppable(
            _write_inputs,
            path,
            rows,
            before_replace=replace,
            digest=digest,
            then=then,
            durable=self.durable,
        )
        self.materialized_sha256 = digest.hexdigest()
        self.expected = count
        self._opened(status_at=trio.current_time(), folder_synced=True)
        if failed is not None:
            raise failed
        return count

    def seed(
        self, *, expected: int, landed: set[RolloutKey], statuses: Iterable[RolloutStatus]
    ) -> None:
        """Start a resumed store from what the run folder already holds.

        Call it once the caller's checks of the folder passed: only then are torn tails repaired
        and leftover temp files removed, so a resume refused before it changes nothing.

        Args:
            expected: rollouts of the whole run.
            landed: keys (`rollout_key`) of the rollouts already landed; taken, not copied.
            statuses: the latest state of rollouts that have an outcome but have not landed.

        From then on the counts and the status file cover the whole run, and a landed rollout
        is refused a second row even when this session never saw it land.

        Raises:
            RunFolderError: a torn tail cannot be repaired.
        """
        self._check_open()
        remove_temp_files(self.layout)  # a resume lists the folder whatever the lock says
        self._leftovers_removed()
        for path in (self.layout.rollouts, self.layout.failures, self.layout.attempts):
            with os_errors(path, "repair the tail of"):
                jsonl.repair_tail(path)
        self.expected = expected
        self._landed = landed
        self._pending = {rollout_key(s.task_index, s.rollout_index): s for s in statuses}
        self._status_dirty = True
        self._opened(status_at=-math.inf)

    async def reserve(self, attempts: Sequence[tuple[Identity, int]]) -> None:
        """Put attempt numbers in the ledger before they are sent (`AttemptReserver`).

        One ``write(2)``: the numbers survive a SIGKILL once it returns. They survive a power
        loss per the fsync policy: ``row`` fsyncs before returning (calls waiting meanwhile
        share the next fsync), ``batch`` within ``fsync_every_s`` (with the outcome rows),
        ``never`` not at all.

        Raises:
            RunFolderWriteError: the ledger cannot be written; the store then writes nothing
                more (every later call raises the same error).

        Cancellation: a checkpoint only under ``row`` (during the fsync); if cancelled, the
        numbers may be on record but nothing was sent, which is safe: a number is skipped,
        never reused.

        It runs once per rollout, so it does not check the folder's lock (`write` does, with
        every batch): a writer that lost the folder could only add numbers, which spends
        them, never reuses them.
        """
        if not self._started or self._failure is not None or self._closed:
            self._check_started()
        line = encode_reservation([(i.task_index, i.rollout_index, a) for i, a in attempts])
        try:
            self._ledger.append(line)  # names the file when the OS refuses it
        except RunFolderWriteError as exc:
            if self._failure is None:
                self._failure = exc
            raise
        self._reserved += 1
        policy = self.config.fsync
        if policy is FsyncPolicy.ROW:
            await self._sync_reservations(self._reserved)
        elif policy is FsyncPolicy.BATCH and self._unsynced_since is None:
            self._unsynced_since = trio.current_time()
            self._changed.set()

    def reserve_now(self, identity: Identity, attempt: int) -> bool:
        """Reserve one attempt's number without a checkpoint, when the policy needs no fsync
        before the send (``batch``, ``never``); False: the caller awaits `reserve` instead.

        The worker's path, once per rollout: the ledger line is formatted directly (the bytes
        `encode_reservation` gives) and written with one ``write(2)``.

        Raises:
            RunFolderWriteError: as `reserve`.
        """
        if self._fsync_each or not self._started or self._failure is not None or self._closed:
            return False
        line = b'{"attempts":[[%d,%d,%d]]}\n' % (
            identity.task_index,
            identity.rollout_index,
            attempt,
        )
        try:
            self._ledger.append(line)
        except RunFolderWriteError as exc:
            if self._failure is None:
                self._failure = exc
            raise
        self._reserved += 1
        if self._unsynced_since is None and self.config.fsync is FsyncPolicy.BATCH:
            self._unsynced_since = trio.current_time()
            self._changed.set()
        return True

    def resent(self, identity: Identity, attempt: int, retry: int) -> None:
        """Note in the ledger that re-send `retry` of `attempt` leaves (`ResendRecorder`).

        One ``write(2)``, no fsync of its own (it reserves nothing: the attempt's number is on
        record already). A store that cannot write any more notes nothing: the outcome write
        that follows reports the failure.
        """
        if not self._started or self._failure is not None or self._closed:
            return
        line = encode_resend(identity.task_index, identity.rollout_index, attempt, retry)
        try:
            self._ledger.append(line)
        except RunFolderWriteError as exc:
            self._failure = exc

    async def _sync_reservations(self, upto: int) -> None:
        """Fsync the ledger until reservation line ``upto`` is on disk (group commit)."""
        async with self._sync_lock:
            if self._reserved_synced >= upto or self._closed:
                return
            target = self._reserved
            fds: list[int | None] = [self._ledger.sync_target()]
            if self._ledger.created:
                fds.append(None)
            self._ledger.dirty = self._ledger.created = False
            with self._mid_run(self._ledger.path, "fsync"):
                await _off_loop(fsync_all, fds, self.layout.output.parent)
            self._reserved_synced = target

    async def write(self, outcomes: Sequence[Outcome]) -> None:
        """Append a batch of outcomes to the run folder, then fsync per the policy.

        Raises:
            RunFolderWriteError: a file cannot be written (disk full, I/O error). What the batch
                appended is cut away again, and the store writes nothing more: every later call
                raises the same error, so the folder holds no torn row and stays resumable.

        Cancellation: the rows are written before the first checkpoint; a cancellation during
        the fsync or status update that follows leaves them written but perhaps not yet synced
        (`aclose` syncs them). Not safe to retry: the batch is already written. The engine calls
        this inside a shielded scope.
        """
        self._check_writer()
        landed, failures, changes, released = self._encode(outcomes)
        with self._mid_run(self.layout.output, "append to the run files of"):
            self._append(landed, failures)
        if released:  # a hint: one lost (the disk refused it, a kill) spends its numbers
            with suppress(RunFolderWriteError):
                self._ledger.append(encode_release(released))
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
        """Fsync what is written, save the final status (``closed=True``), close the files.

        `open_run_store` calls this at exit under a shielded scope; calling it twice is harmless.

        Cancellation: a checkpoint; if cancelled, the files are still closed, but the final
        fsync or status may be missing (the rows themselves are already written).
        """
        if self._closed:
            return
        try:
            if self._failure is not None:
                return  # the disk refused a write: writing more would only fail again
            # One worker-thread job does both, in this order: the rows are fsynced before the
            # status saying they are there (a hop costs about 0.1 ms of CPU, once per shard).
            async with self._sync_lock, self._status_lock:
                sync = None if self.config.fsync is FsyncPolicy.NEVER else self._take_unsynced()
                status = self._take_status(finished=True) if self._status_enabled else None
                reserved = self._reserved
                if sync is not None or status is not None:
                    await _off_loop(self._flush_and_save, sync, status)
                if sync is not None:
                    self._reserved_synced = max(self._reserved_synced, reserved)
        finally:
            self._close_files()

    # --- opening ------------------------------------------------------------------------------

    def _open(self, *, fresh: bool) -> None:
        """Decide how the run may start (under the lock); nothing is written yet."""
        new = folder_state(self.layout) is FolderState.NEW
        if fresh:
            check_fresh(self.layout, overwrite=self.config.overwrite)
        self._may_replace = fresh or new
        self._may_start_bare = fresh and new

    def _start_bare(self) -> None:
        """Start a fresh run in a new folder at its first outcome, without materialized inputs.

        A driver may record outcomes alone; the folder holds nothing to keep, and a run that
        writes its inputs starts in `write_materialized_inputs` before its first outcome.
        """
        with os_errors(self.layout.output, "start the run in"):
            _clear_run_files(self.layout, None, temps=self._leftovers())
        self._leftovers_removed()
        self._opened(status_at=trio.current_time())

    def _leftovers(self) -> bool:
        """Whether a writer may have left temp files here: the lock holds the record of one
        that died holding it (`lock.RunLock.inherited`), or there is no lock to tell."""
        return self._lock is None or self._lock.inherited

    def _leftovers_removed(self) -> None:
        if self._lock is not None:
            self._lock.crash_handled()

    def _opened(self, *, status_at: float, folder_synced: bool = False) -> None:
        """Open the rollouts file and start saving status: the run has begun.

        ``folder_synced``: the rollouts file was created before a fsync of its folder (the new
        inputs' rename beside it), so its name is durable already.
        """
        self._status_at = status_at
        self._status_enabled = True
        self._status_dirty = True  # the first status: due status_interval_s after status_at
        self._changed.set()
        self._started = True
        self._rollouts.open()
        self._rollouts.created = False
        if not folder_synced and self.durable:
            fsync_dir(self.layout.output.parent)

    def _check_open(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise RunFolderError(
                f"the run store of {str(self.layout.output)!r} is closed; write before leaving "
                "open_run_store's block"
            )

    def _check_started(self) -> None:
        self._check_open()
        if not self._started and self._may_start_bare:
            self._start_bare()
        if not self._started:
            raise RunFolderError(
                f"the run store of {str(self.layout.output)!r} has not started: write the "
                "materialized inputs (a new run) or seed it (a resume) before any outcome"
            )

    def _check_writer(self) -> None:
        """Check the store may write: started, not failed, and still the folder's writer."""
        self._check_started()
        if self._lock is not None:
            try:
                self._lock.verify()
            except RunFolderWriteError as exc:
                self._failure = exc
                raise

    def _close_files(self) -> None:
        self._closed = True
        self._changed.set()
        self._rollouts.close()
        self._failures.close()
        self._ledger.close()

    # --- writing ------------------------------------------------------------------------------

    def _encode(
        self, outcomes: Sequence[Outcome]
    ) -> tuple[
        list[bytes],
        list[bytes],
        list[tuple[RolloutKey, RolloutStatus | None, bool]],
        list[tuple[int, int, int]],
    ]:
        """Serialize a batch: landed lines, sidecar lines, the status change of each, and the
        attempts that never reached a server (their numbers are released)."""
        landed: list[bytes] = []
        failures: list[bytes] = []
        changes: list[tuple[RolloutKey, RolloutStatus | None, bool]] = []
        released: list[tuple[int, int, int]] = []
        batch: set[RolloutKey] = set()
        for outcome in outcomes:
            key = identity_key(outcome.identity)
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
                started = not never_started(outcome)
                changes.append((key, status_of(outcome), started))
                if not started:
                    ident = outcome.identity
                    released.append((ident.task_index, ident.rollout_index, outcome.attempt_index))
        return landed, failures, changes, released

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

    def _apply(self, changes: list[tuple[RolloutKey, RolloutStatus | None, bool]]) -> None:
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
            fds = self._take_unsynced()
            if fds is None:
                return
            reserved = self._reserved
            with self._mid_run(self.layout.output, "fsync the run files of"):
                await _off_loop(fsync_all, fds, self.layout.output.parent)
            self._reserved_synced = max(self._reserved_synced, reserved)

    def _take_unsynced(self) -> list[int | None] | None:
        """Return what to fsync (None in the list: the folder), counted as synced; None when
        nothing is unsynced. Call under ``_sync_lock``."""
        files = [a for a in (self._rollouts, self._failures, self._ledger) if a.dirty]
        if not files or self._closed:
            return None
        fds: list[int | None] = [a.sync_target() for a in files]
        if any(a.created for a in files):
            fds.append(None)  # the folder: a new file's name must survive a crash too
        for a in files:
            a.dirty = a.created = False
        self._unsynced_rows, self._unsynced_since = 0, None
        return fds

    async def _write_status(self, *, finished: bool = False) -> None:
        if not self._status_enabled:
            return
        async with self._status_lock:
            if not finished and (self._closed or self._status_due() > trio.current_time()):
                return  # written (or closed) by the other task while this one waited
            args = self._take_status(finished=finished)
            path = self.layout.batch_status
            with self._mid_run(path, "save the batch status"):
                save = functools.partial(status_file.save_status, durable=self.durable)
                await _off_loop(save, path, *args)

    def _take_status(self, *, finished: bool) -> _StatusArgs:
        """Copy the status's state on the loop (sorting and serializing happen in the thread),
        counted as saved: `status.save_status`'s arguments. Call under ``_status_lock``."""
        self._status_dirty, self._status_at = False, trio.current_time()
        return (self.expected, len(self._landed), list(self._pending.values()), finished)

    def _flush_and_save(self, sync: list[int | None] | None, status: _StatusArgs | None) -> None:
        """Fsync ``sync``, then save ``status`` (either may be None): `aclose`'s thread job.

        A durable status's save ends with a fsync of the folder, after its rename: that one
        also makes the names of files created since the last folder fsync durable, so the
        folder is not fsynced twice (the rows' data is on disk before the status is renamed).
        """
        if sync is not None and status is not None and self.durable:
            sync = [fd for fd in sync if fd is not None]
        if sync:
            with self._mid_run(self.layout.output, "fsync the run files of"):
                fsync_all(sync, self.layout.output.parent)
        if status is not None:
            with self._mid_run(self.layout.batch_status, "save the batch status"):
                status_file.save_status(self.layout.batch_status, *status, durable=self.durable)

    @contextmanager
    def _mid_run(self, path: Path, action: str) -> Iterator[None]:
        """Translate an OSError of a running store; remember it, so nothing more is written."""
        try:
            with os_errors(path, action, RunFolderWriteError):
                yield
        except RunFolderWriteError as exc:
            if self._failure is None:
                self._failure = exc
            raise


# --- helpers (sync: they run in worker threads) ---------------------------------------------------


async def _off_loop(fn: Callable[..., _T], *args: object) -> _T:
    """Run blocking file work in a worker thread (tests replace this to stay on the fake clock)."""
    return await trio.to_thread.run_sync(fn, *args)


async def _off_loop_stoppable(fn: Callable[..., _T], *args: object, **kwargs: object) -> _T:
    """Run a long whole-file write in a worker thread that a cancellation stops at once.

    ``fn`` takes a ``stop`` event and must raise once it is set (`files.write_materialized`
    checks it every few rows). A cancelled caller, Ctrl-C included (Trio delivers
    KeyboardInterrupt to the waiting task), sets it and waits for the thread to clean up (its
    temp file removed) before the cancellation propagates: a write of gigabytes never keeps a
    user waiting, and never leaves a temp file behind.
    """
    # A caller cancelled already raises here: `to_thread.run_sync` would raise at its own first
    # checkpoint without starting the thread, and the wait below would last `_STOP_WAIT_S`
    # for a thread that never ran (this check and that one have no checkpoint between them).
    await trio.lowlevel.checkpoint_if_cancelled()
    stop, done = threading.Event(), threading.Event()

    def work() -> _T:
        try:
            return fn(*args, stop=stop, **kwargs)
        finally:
            done.set()

    try:
        return await trio.to_thread.run_sync(work, abandon_on_cancel=True)
    except BaseException:
        stop.set()
        done.wait(_STOP_WAIT_S)  # blocking on purpose: cleanup must end before we unwind
        raise


def _write_inputs(
    path: Path,
    rows: Iterable[MaterializedRow | Mapping[str, Any]],
    *,
    stop: threading.Event,
    digest: Any,
    before_replace: Callable[[Path], None] | None = None,
    then: Callable[[str], None] | None = None,
    durable: bool = True,
) -> tuple[int, Exception | None]:
    """Write the materialized inputs (`files.write_materialized`), then call ``then`` with their
    sha256 unless the caller stopped meanwhile; return the count and what ``then`` raised."""
    count = write_materialized(
        path, rows, stop=stop, before_replace=before_replace, digest=digest, durable=durable
    )
    if then is None or stop.is_set():
        return count, None
    try:
        then(digest.hexdigest())
    except Exception as exc:  # raised by the caller, once the store has started
        return count, exc
    return count, None


def _clear_run_files(layout: RunLayout, new_inputs: Path | None, *, temps: bool) -> None:
    """Remove an old run's files (its status too: the new run's first follows) and
    (``temps``: a writer died here) leftover temp files.

    ``new_inputs`` is the temp file of the new materialized inputs, renamed into place next
    (None: there are none yet, so the old ones go too).
    """
    if temps:  # lists the folder: a shards folder holds thousands of files
        remove_temp_files(layout, keep=new_inputs)
    for path in layout.all_files():
        if not (new_inputs is not None and path == layout.materialized_inputs):
            with suppress(FileNotFoundError):
                os.unlink(path)
