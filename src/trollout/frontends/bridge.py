"""A `Rollouts` run by Trio in a thread of its own, driven from other threads or an asyncio loop.

`RolloutsThread` starts ``trio.run`` in a new thread, opens `open_rollouts` there and serves
requests until it is stopped. Other threads never call Trio: they schedule work with the
thread's `trio.lowlevel.TrioToken` (``run_sync_soon``, thread-safe), and the Trio side reports
back through callbacks the front end supplies, which only hand values over (a
``queue.SimpleQueue.put`` for the blocking front end, ``loop.call_soon_threadsafe`` for
asyncio). Each open batch is one Trio task in the thread's nursery that holds the batch's
``async with`` open (`_BatchTask`): it pushes outcomes out as they settle, in groups (one
hand-over per wake-up, not per outcome), and closes the batch when asked, or when the thread
stops.

Design note: the choice between this and Trio guest mode (Trio running on the asyncio loop's
own thread, `trio.lowlevel.start_guest_run`) was made by measurement, with bench/frontends.py
(which builds the guest-mode variant of this very front end to compare). 20,000 rollouts in
batches of 1,000 against the fake, a 10 ms asyncio ticker beside, three runs each: CPU per
rollout is within noise (guest 0.37-0.38 ms, thread 0.37-0.39 ms at 64 in flight; 0.35-0.37
against 0.39-0.41 at 512), while the worst ticker gap was 35-38 ms with the thread against
44-53 ms in guest mode at 64 in flight (a ticker alone on the same machine: 15 ms). In guest
mode every burst of Trio work runs inside the asyncio loop's callbacks; here it runs in its own
thread and the loop only runs one short callback per group of outcomes. And the blocking front
end needs a Trio thread anyway, so one mechanism serves both. trio-asyncio does not fit an
asyncio *program*: it hosts asyncio inside Trio, so the trainer would have to run under
``trio_asyncio.run`` instead of ``asyncio.run`` (measured too: 0.30-0.34 ms per rollout, but
25 MiB more peak RSS, and it patches asyncio for the whole process); it serves in-process
asyncio *agents* instead (`asyncio_agent`).
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio

from ..collector.deployment.discovery import Deployment
from ..collector.engine.batch import Batch, BatchOutcome, BatchRows
from ..errors import TrolloutError
from ..records import MaterializedRow
from ..settings import RunConfig
from .rollouts import Rollouts, open_rollouts

__all__ = ["BatchCallbacks", "BatchTask", "RolloutsThread"]

_START_GUARD_S = 600.0  # a thread that neither starts nor fails in this long is hung


class BatchCallbacks:
    """How the Trio side reports one batch to its front end (called in the Trio thread).

    Subclasses hand values over to the caller's thread or loop and must not block.
    """

    def opened(self, run_id: str) -> None:
        """The batch started, under ``run_id``."""

    def items(self, items: list[BatchOutcome]) -> None:
        """Outcomes settled (in completion order)."""

    def ended(self) -> None:
        """Every row settled and was handed over: no more items."""

    def done(self, drained: list[BatchOutcome], error: BaseException | None) -> None:
        """The batch closed (every accepted row reached its sink), with what a drain returned
        or the error that ended it."""


class BatchTask:
    """The Trio side of one batch: a task holding ``rollouts.open_batch`` open.

    ``forget`` is called once the batch is reported done (`settle`), which happens once.
    """

    def __init__(
        self,
        rows: BatchRows,
        options: Mapping[str, Any],
        report: BatchCallbacks,
        forget: Callable[[BatchTask], None],
    ) -> None:
        self.rows = rows
        self.options = dict(options)
        self.report = report
        self._forget = forget
        self._settled = False
        self._pump = trio.CancelScope()
        self._close = trio.Event()
        self._drain = False
        self._batch: Batch | None = None  # once open
        self._stop_reason: str | None = None  # admission stopped, maybe before the batch opened

    def request_close(self, drain: bool) -> None:
        """Stop handing outcomes out and close the batch (runs in the Trio thread)."""
        self._drain = self._drain or drain
        self._pump.cancel(reason="the caller closed the batch")
        self._close.set()

    def request_stop_admission(self, reason: str) -> None:
        """Start no more of the batch's rows; those in flight go on (runs in the Trio thread)."""
        if self._stop_reason is None:
            self._stop_reason = reason
        if self._batch is not None:
            self._batch.stop_admission(reason)

    def settle(self, drained: list[BatchOutcome], error: BaseException | None) -> None:
        """Report the batch done, the first time only (its task, a refusal or the thread's end)."""
        if self._settled:
            return
        self._settled = True
        self._forget(self)
        self.report.done(drained, error)

    async def run(self, rollouts: Rollouts) -> None:
        """Hold the batch open, push its outcomes, close it when asked.

        Cancellation: cancelled when the thread stops; the batch then closes (its exit is
        shielded) and `BatchCallbacks.done` reports the cancellation.
        """
        drained: list[BatchOutcome] = []
        try:
            async with rollouts.open_batch(self.rows, **self.options) as batch:
                self._batch = batch
                if self._stop_reason is not None:
                    batch.stop_admission(self._stop_reason)
                self.report.opened(batch.run_id)
                with self._pump:
                    async for first in batch:
                        self.report.items([first, *batch.ready_nowait()])
                    self.report.ended()
                await self._close.wait()
                if self._drain:
                    drained = await batch.aclose_and_drain()
        except BaseException as exc:
            self.settle([], exc)
            if not isinstance(exc, Exception):
                raise
            return
        self.settle(drained, None)


class RolloutsThread:
    """`open_rollouts` in a Trio thread of its own (see the module docstring).

    Every batch opened is reported done exactly once, at the latest when the thread ends, so
    no front end waits on a thread that is gone.

    Args:
        deployment: as `open_rollouts`.
        **options: `open_rollouts`'s keyword arguments (config, record_output_dir, ...).
    """

    def __init__(self, deployment: Deployment | Mapping[str, str], **options: Any) -> None:
        self._deployment = deployment
        self._options = options
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stopped: trio.Event | None = None
        # Guards the batches not yet reported done, and whether the Trio run has ended.
        self._lock = threading.Lock()
        self._open: set[BatchTask] = set()
        self._ended = False
        self.rollouts: Rollouts | None = None
        self._thread = threading.Thread(target=self._run, name="trollout-trio", daemon=True)

    @property
    def config(self) -> RunConfig:
        """The collection settings."""
        assert self.rollouts is not None
        return self.rollouts.config

    def start(self) -> None:
        """Start the thread and wait until the collector is open (blocking).

        Raises:
            Exception: whatever opening raised (bad URLs, a bad config).
        """
        self._thread.start()
        if not self._ready.wait(_START_GUARD_S):
            raise TrolloutError("the trollout thread did not start; see its traceback above")
        if self._error is not None:
            raise self._error

    def open_batch(
        self, rows: BatchRows, options: Mapping[str, Any], report: BatchCallbacks
    ) -> BatchTask:
        """Start a batch (non-blocking); ``report`` hears what happens to it.

        Raises:
            TrolloutError: the thread is not running (``report`` hears nothing then).
        """
        task = BatchTask(rows, options, report, self._forget)
        with self._lock:
            if self._ended:
                raise TrolloutError("the trollout thread has stopped") from self._error
            self._open.add(task)
        try:
            self._call(self._start_batch, task)
        except BaseException:
            self._forget(task)
            raise
        return task

    def close_batch(self, task: BatchTask, *, drain: bool) -> None:
        """Ask a batch to close (non-blocking); ``report.done`` says when it has (at the
        latest when the thread ends, so asking an ended thread does nothing)."""
        assert self._token is not None  # a batch was opened
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(task.request_close, drain)

    def stop_admission(self, task: BatchTask, reason: str) -> None:
        """Ask a batch to start no more rows (non-blocking); asking an ended thread does
        nothing."""
        assert self._token is not None  # a batch was opened
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(task.request_stop_admission, reason)

    def stop(self) -> None:
        """Close every open batch and the collector (non-blocking); `join` waits for it.

        On a thread that has ended it does nothing (`join` raises what ended it).
        """
        stopped, token = self._stopped, self._token
        if stopped is not None and token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(stopped.set)

    def join(self) -> None:
        """Wait until the thread has ended (blocking), then raise what ended it, if anything."""
        self._thread.join()
        if self._error is not None:
            raise self._error

    def _call(self, fn: Callable[..., object], *args: object) -> None:
        if self._token is None:
            raise TrolloutError("the trollout thread is not running; open it with `with` first")
        try:
            self._token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:
            raise TrolloutError("the trollout thread has stopped") from self._error

    def _forget(self, task: BatchTask) -> None:
        with self._lock:
            self._open.discard(task)

    def _start_batch(self, task: BatchTask) -> None:
        # Runs in the Trio thread, outside any task: an exception here would crash the run.
        if self._nursery is None or self.rollouts is None or self._stopped_set():
            task.settle([], TrolloutError("the trollout front end is closed"))
            return
        self._nursery.start_soon(task.run, self.rollouts)

    def _stopped_set(self) -> bool:
        return self._stopped is not None and self._stopped.is_set()

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:
            self._error = exc
        finally:
            self._fail_open_batches()
            self._ready.set()

    def _fail_open_batches(self) -> None:
        """Report every batch not yet reported done as failed: nothing will report it now."""
        with self._lock:
            self._ended = True
            left, self._open = list(self._open), set()
        for task in left:
            error = TrolloutError("the trollout thread ended while the batch was open")
            error.__cause__ = self._error
            task.settle([], error)

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stopped = trio.Event()
        async with open_rollouts(self._deployment, **self._options) as rollouts:
            try:
                async with trio.open_nursery() as nursery:
                    self.rollouts, self._nursery = rollouts, nursery
                    self._ready.set()
                    await self._stopped.wait()
                    nursery.cancel_scope.cancel(reason="the trollout front end was closed")
            finally:
                self._nursery = None  # closed (a crash need not set _stopped): start nothing


class FrontEndBatch:
    """What both front ends' batches keep: outcomes handed over, and how the batch ended.

    Attributes:
        run_id: the batch's run id (its rollout ids' prefix, a shard's run id).
    """

    def __init__(self, thread: RolloutsThread, rows: BatchRows, options: Mapping[str, Any]):
        self._thread = thread
        self._rows = rows
        self._options = options
        self._buffer: deque[BatchOutcome] = deque()
        self._ended = False
        # Set once the Trio side closed the batch: (settled but not handed over, its error).
        self._done: tuple[list[BatchOutcome], BaseException | None] | None = None
        self._task: Any = None
        self.run_id = ""

    def stop_admission(self, reason: str = "the batch stopped admission") -> None:
        """Start no more of this batch's rows; those in flight go on and are still yielded
        (keep iterating to get them). Does not block.

        Rows never started are not yielded (a recorded shard settles them as drained when the
        batch closes), as with the Trio API's `Batch.stop_admission`.
        """
        if self._task is not None and self._done is None:
            self._thread.stop_admission(self._task, reason)

    def _take_drained(self) -> list[BatchOutcome]:
        """Return what settled but was not consumed, once (a second drain returns nothing)."""
        assert self._done is not None
        drained = [*self._buffer, *self._done[0]]
        self._buffer.clear()
        self._done = ([], self._done[1])
        return drained

    def _raise_error(self) -> None:
        """Raise the error the batch ended with, once."""
        if self._done is None or self._done[1] is None:
            return
        error, self._done = self._done[1], (self._done[0], None)
        if isinstance(error, Exception):
            raise error
        raise TrolloutError("the trollout front end closed while the batch was open") from error


class FrontEndRollouts:
    """What both front ends' `Rollouts` share: the thread, its deployment, settings, planning."""

    def __init__(self, thread: RolloutsThread) -> None:
        self._thread = thread
        assert thread.rollouts is not None
        self.deployment: Deployment = thread.rollouts.deployment
        self.config: RunConfig = thread.rollouts.config

    @property
    def next_task_index(self) -> int:
        """The task index `plan`'s next call starts from (as `Rollouts.next_task_index`)."""
        assert self._thread.rollouts is not None
        return self._thread.rollouts.next_task_index

    def plan(
        self, rows: Sequence[Mapping[str, Any]], *, start_task_index: int | None = None
    ) -> list[MaterializedRow]:
        """Materialize dataset rows with this run's settings (as `Rollouts.plan`, whose
        numbering it shares; planning runs in the caller's thread)."""
        assert self._thread.rollouts is not None
        return self._thread.rollouts.plan(rows, start_task_index=start_task_index)
