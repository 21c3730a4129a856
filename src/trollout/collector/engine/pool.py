# Stays whole: the feeder and the workers share one ready queue, its counters and the rows
# channel: one state machine (see "Rows are lent a batch at a time").
"""The workers of one source of rows: the collector's own (`submit`, `collect`) or one batch.

A `Pool` owns a nursery of workers, each holding at most one rollout; the collector owns
everything the pools share (the limiter, the transport, the retry state, the dispatch window,
the single writer). Every outcome a worker settles goes to the collector's writer tagged with
its pool, and the writer hands it back to that pool (`Pool.deliver`) once the pool's sink has it.

- **Rows are lent a batch at a time.** `feed` puts a batch of rows (at most 256) in the pool's
  ready queue, and a worker that finishes a rollout takes the next row from it itself,
  synchronously: no task switch and no channel hop per row.
  A worker with nothing to take waits on a zero-buffer channel, over which the feeder hands it
  a row (and `offer`, `submit`'s one row); a row offered there is older than the queue's, so a
  worker takes it first. The feeder wakes only when the queue is empty or a worker is waiting,
  and moves to the next batch only once this one is taken, so back-pressure reaches the input
  and memory holds one batch. A row still queued when admission closes (`stop_admission`, the
  feeder's deadline) was never accepted: the feeder drops the queue, and no worker takes a row
  once admission is closed or while it is cancelled.
- **A number is reserved when its request is about to leave, not before.** A worker reserves
  its attempt's number with the reserver (the run folder's ledger: one ``write(2)``, no fsync
  unless the policy is ``row``) once it holds a limiter token and admission is still open, right
  before `dispatch`: a row queued, waiting for a token, or drained never had a number on record,
  so a kill (SIGKILL, preemption) spends only the numbers of requests that may have left, and
  when every token is busy, none. A rollout ended before `dispatch` began (cancelled while it
  waited for its token or its reservation's fsync) settles as drained, never started, so its
  number is released (`recovery.ledger`). A re-send under ``retry_requests`` reserves the next
  number in its `NewAttempt` hook, never one at ``max_attempts`` or above.
- **Started on demand.** A worker is started for a row no idle worker will take (the feeder
  starts one per such lent row at once, so a batch's first rows all start together), so a
  pool never has more workers than rows (``--concurrency 1000000`` over 3 rows starts 3), and
  at most ``max_resident_rollout_tasks`` (default: the concurrency).
- **Hosted outside the driver's code.** A pool's nursery lives in a task of the collector's
  nursery (`serve`), not around the driver's block, so cancelling a pool (`cancel`: an early
  batch exit, `Collector.cancel_in_flight`) cancels its workers and nothing else: never the
  caller's code, never another batch.
- **Exactly once.** Every row a pool accepts produces exactly one final outcome that reaches the
  writer: a rollout ended by anything but a reply (a cancellation, bare or inside an exception
  group; KeyboardInterrupt; an error raised by `dispatch` itself) settles as `Omitted`
  (interrupted) before the exception goes on; a finished one is handed over without a
  checkpoint (`hand_over`); a row refused at the door (admission closed) is settled as drained
  by the caller that offered it. ``accepted`` and ``settled`` count rows (a row is accepted when
  a worker takes it, in the same step); a pool is complete when its workers have exited and
  both counts agree.
- **An error stays in its pool.** An exception from `dispatch` (not a failed rollout, which is
  an outcome, but a bug or a setting the transport refuses) ends the pool it came from, as its
  sink failing does (`Collector.fail`): a batch raises it to its consumer, the collector's own
  pool stops the run. It never escapes the worker, which would end every batch; an error that
  arrives grouped with a cancellation (a transport's nursery) is split off and reported the
  same way while the cancellation goes on.
- **Hand-overs wait as long as the writer lives.** A worker's shielded send is not bounded: a
  sink that takes 40 s to write delays the workers, it does not make them drop outcomes. The
  writer itself is bounded once the collector is being torn down; when it stops, the channel
  breaks, the senders return, and the outcomes that never reached the sink are counted
  (`Collector.unrecorded`) and logged by the collector.

Rejected alternatives: one pool shared by every batch, each rollout under a cancel scope of its
batch. A scope per rollout costs 8-10 us (docs/design.md), and a pool per batch gets the same
isolation from the nursery Trio gives every task group, at no cost per rollout. For the
numbers: the feeder reserving each batch before lending it (what this replaced: one write per
256 rows, but a kill spent every queued row's number, so rollouts sent once landed as attempt
2 or 3), or a chunk sized by the demand (free tokens) when the queue runs dry: in the steady
state a finishing worker frees one token, so the chunk is one row either way, and the feeder
would cost a task switch and a channel hop per rollout where the worker's own ``write(2)``
costs about a microsecond. An fsync per reservation under ``batch`` was rejected too: the
numbers are as durable as the outcome rows, per the run's policy.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol, TypeAlias

import trio

from ...records import (
    Failed,
    Identity,
    Landed,
    MaterializedRow,
    OmitReason,
    Omitted,
    Outcome,
    policy_model_server_of,
)
from ...settings import RunConfig
from ..dispatch.request import DispatchPolicy, NewAttempt, dispatch
from ..dispatch.retry import RetryState
from ..http.transport import PostTransport
from .observer import Observer
from .progress import Progress
from .sink import AttemptReserver, OutcomeSink, ResendRecorder
from .timing import RunTimer
from .window import DispatchWindow

__all__ = [
    "SHIELDED_FLUSH_S",
    "Enrich",
    "Pool",
    "PoolHost",
    "Settled",
    "hand_over",
    "lend_batches",
]

SHIELDED_FLUSH_S = 30.0  # how long a cancelled run may spend flushing settled outcomes
_LEND_BATCH = 256  # rows taken from the input at once, at most (their numbers are not reserved)
_Job: TypeAlias = tuple[MaterializedRow, int, str]  # a row, its attempt number and its /run URL
Settled: TypeAlias = tuple["Pool", Outcome, MaterializedRow | None]
"""What workers send the writer: the pool, the outcome, and the row when the outcome is the
rollout's final one (None for an attempt superseded by a new one under ``retry_requests``)."""
Deliver = Callable[["Pool", list[tuple[Outcome, MaterializedRow | None]]], None]


class Enrich(Protocol):
    """What a worker applies to a landed outcome before handing it over (`enrichment.Enricher`).

    ``__call__`` returns the outcome to record (it may read files; never raises for what it
    reads). ``interrupted`` returns, without I/O, what to record when that call was cancelled.
    """

    async def __call__(self, outcome: Landed, row: Mapping[str, Any] | None = None) -> Landed: ...

    def interrupted(self, outcome: Landed, row: Mapping[str, Any] | None = None) -> Landed: ...

    async def before(self, identity: Identity, attempt: int) -> None:
        """Called right before an attempt is sent (clears stale evidence of its key)."""


class PoolHost(Protocol):
    """What a pool uses of the engine hosting it (the `collector.Collector`), and nothing more.

    The pool reads the shared state its workers dispatch with, counts its workers into the
    engine's totals, hands outcomes to the engine's writer (`out_tx`), and reports the two
    events that reach beyond the pool (`stop_admission`, `fail`). Naming exactly this keeps the
    pool from importing the collector, which hosts pools: no import cycle between the two.
    """

    config: RunConfig
    progress: Progress  # `submitted` counts every row a pool accepts
    window: DispatchWindow  # the run's admission
    limiter: trio.CapacityLimiter  # requests in flight, shared by every pool
    transport: PostTransport
    policy: DispatchPolicy
    retry_state: RetryState
    rng: random.Random
    timer: RunTimer
    observer: Observer | None
    policy_servers: Mapping[str, str]
    out_tx: trio.MemorySendChannel[Settled]  # the writer's channel
    spawned: int  # workers started, every pool
    resident: int  # rollouts held by workers now, every pool
    max_resident: int
    enrich: Enrich | None  # applied to each landed outcome before hand-over (None: off)

    def stop_admission(self, reason: str) -> None:
        """Start no new rollout in any pool (the run's dispatch window closed)."""
        ...

    def fail(self, pool: Pool, exc: Exception, reason: str, *, whole_run: bool = False) -> None:
        """End ``pool`` with ``exc`` (a rollout raised instead of settling)."""
        ...


class Pool:
    """The workers of one source of rows (see the module docstring).

    Args:
        engine: the collector (`PoolHost`) whose limiter, transport and writer the workers
            share.
        sink: where the writer hands this pool's outcomes (None: nowhere).
        reserver: what reserves attempt numbers before they are sent (None: nothing does).
        deliver: called by the writer with the outcomes it settled for this pool.
    """

    def __init__(
        self,
        engine: PoolHost,
        *,
        sink: OutcomeSink | None,
        reserver: AttemptReserver | None,
        deliver: Deliver,
        window: DispatchWindow | None = None,
    ) -> None:
        self.engine = engine
        # When this pool's rows may start: the run's window (the collector's own pool), or a
        # batch's own (`DispatchWindow.for_batch`), whose spent budget ends this pool's admission.
        self.window = engine.window if window is None else window
        self.sink = sink
        self.reserver = reserver
        # The reserver's path without a checkpoint, when it has one (`RunStore.reserve_now`).
        self._reserve_now = getattr(reserver, "reserve_now", None)
        self._on_resend = sink.resent if isinstance(sink, ResendRecorder) else None
        self._deliver = deliver
        self.enrich: Enrich | None = engine.enrich  # a batch may turn it off (enrich_results)
        self.rows_tx, self._rows_rx = trio.open_memory_channel[_Job](0)
        self.feed_scope = trio.CancelScope()
        self.admitting = True
        self.accepted = 0  # rows taken by a worker, or settled at the door
        self.settled = 0  # final outcomes the writer delivered
        self.sink_error: Exception | None = None  # the sink failed: nothing more is written to it
        self.error: Exception | None = None  # what ended this pool, for its consumer to raise
        self.changed = trio.Event()  # set (and replaced) whenever the writer delivers
        self.finished = trio.Event()  # the workers' nursery has exited
        self._nursery: trio.Nursery | None = None
        self._no_more_rows = trio.Event()
        self._spawned = 0
        self._idle = 0  # workers ready for a row: waiting, or started and about to wait
        self._ready: deque[_Job] = deque()  # the feeder's rows workers may take (see `_lend`)
        self._feeder: trio.lowlevel.Task | None = None  # the feeder, parked in `_wait_needed`
        self._offering = 0  # offers waiting on the channel (their rows are older than `_ready`)
        self._waiting = 0  # workers waiting in the channel's receive
        self._cancel_reason: str | None = None

    @property
    def complete(self) -> bool:
        """Whether no row can come any more and every accepted row has settled."""
        return self.finished.is_set() and self.settled == self.accepted

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the workers' nursery until no row can come and every worker has exited.

        Cancellation: `cancel` (or the collector's scope) cancels the workers; each settles its
        rollout as omitted through the writer before this returns.
        """
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self._cancel_reason is not None:
                    nursery.cancel_scope.cancel(reason=self._cancel_reason)
                task_status.started()
                await self._no_more_rows.wait()
        finally:
            self.close_rows()
            self.finished.set()
            self.wake()

    def start_soon(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        """Start a task among the workers (a batch's feeder): cancelled with them."""
        assert self._nursery is not None, "start the pool (Collector.start_pool) first"
        self._nursery.start_soon(fn, *args)

    async def offer(self, row: MaterializedRow, attempt: int, url: str) -> None:
        """Hand one row to a worker, or settle it as drained when admission is closed.

        Cancellation: a checkpoint; if cancelled, the row was not accepted.
        """
        if not self.admits():
            await self.settle_at_door(row, attempt)
            return
        if self._idle == 0 and self._spawned < self.engine.config.resident_rollouts:
            self._spawn_worker()
        self._offering += 1
        try:
            await self.rows_tx.send((row, attempt, url))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            await self.settle_at_door(row, attempt)  # the workers were cancelled meanwhile
            return
        finally:
            self._offering -= 1
        self._idle -= 1  # counted here: the worker that took it may not have run yet
        self.accepted += 1
        self.engine.progress.submitted += 1

    async def feed(
        self, rows: Iterable[tuple[MaterializedRow, int] | MaterializedRow], resolve: Resolve
    ) -> None:
        """Lend every row (or ``(row, attempt)`` pair) to the workers, resolving its URL.

        Stops when `feed_scope` is cancelled (admission closed) or its deadline (the dispatch
        budget) passes; rows not taken by then were never accepted. A row that cannot be read
        (``rows`` raised) or whose URL cannot be resolved raises once the rows before it were
        taken.

        Cancellation: a checkpoint; rows not yet taken are never accepted.
        """
        with self.feed_scope:
            try:
                for batch in lend_batches(rows, _LEND_BATCH):
                    error: Exception | None = None
                    for row, attempt in batch:
                        try:
                            self._ready.append((row, attempt, resolve(row)))
                        except Exception as exc:  # the rows before it still go out
                            error = exc
                            break
                    if not await self._lend():
                        return  # the rest was never accepted: resume re-runs it
                    if error is not None:
                        raise error
            finally:
                self._ready.clear()

    async def _lend(self) -> bool:
        """Let the workers take the ready rows; return False if admission closed first.

        A worker that finishes takes the next row itself (`_next_job`), and so does a worker
        started for rows no idle worker will take; this task hands rows over the channel only
        to workers waiting in ``receive``, and otherwise sleeps until the queue is empty or a
        worker waits.
        """
        ready = self._ready
        resident = self.engine.config.resident_rollouts
        while ready:
            if not self.admits() or self._no_more_rows.is_set():
                return False  # admission closed, or the workers are gone
            if self._waiting:  # a worker waits in receive: hand it the next row
                row, attempt, url = ready.popleft()
                await self.offer(row, attempt, url)
                continue
            for _ in range(min(len(ready) - self._idle, resident - self._spawned)):
                self._spawn_worker()  # each takes a row from the queue as it starts
            await self._wait_needed()
        return True

    async def _wait_needed(self) -> None:
        """Sleep until `_wake_feeder`: the ready queue emptied, a worker waits, or none can come.

        Cancellation: the lent rows are taken back the moment the cancellation is delivered
        (in the abort callback, before any other task runs), so no worker takes a row after the
        feeder (the driver's `collect`, a batch's feeder) was cancelled.
        """
        self._feeder = trio.lowlevel.current_task()

        def abort(_: object) -> trio.lowlevel.Abort:
            self._feeder = None
            self._ready.clear()
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def _wake_feeder(self) -> None:
        """Wake the feeder if it sleeps in `_wait_needed` (nothing to do otherwise)."""
        if self._feeder is not None:
            feeder, self._feeder = self._feeder, None
            trio.lowlevel.reschedule(feeder)

    def admits(self) -> bool:
        """Whether an offered row may still be started (this pool's and the run's admission)."""
        return self.admitting and self.engine.window.closed_reason is None

    def stop_admission(self, reason: str) -> None:
        """Start no new rollout of this pool; rollouts in flight go on."""
        self.admitting = False
        self.feed_scope.cancel(reason=reason)

    def cancel(self, reason: str) -> None:
        """Stop admission and cancel this pool's rollouts in flight (they settle as omitted)."""
        self.stop_admission(reason)
        if self._cancel_reason is None:
            self._cancel_reason = reason
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel(reason=reason)

    def close_rows(self) -> None:
        """Close the rows channel's ends this pool keeps: no row can come any more."""
        self.rows_tx.close()
        self._rows_rx.close()
        self._no_more_rows.set()
        self._wake_feeder()  # a feeder lending rows stops: no worker can take them any more

    async def settle_at_door(self, row: MaterializedRow, attempt: int) -> None:
        """Settle a row admission refused as drained (never started), exactly once."""
        self.accepted += 1
        self.engine.progress.submitted += 1
        omitted = Omitted(row.identity, attempt, OmitReason.DRAINED, 0.0)
        await hand_over(self.engine.out_tx, (self, omitted, row))

    def deliver(self, settled: list[tuple[Outcome, MaterializedRow | None]]) -> None:
        """Take outcomes the writer settled for this pool (the writer's task calls this)."""
        self.settled += sum(1 for _, row in settled if row is not None)
        self._deliver(self, settled)
        self.wake()

    def wake(self) -> None:
        """Wake whoever waits for this pool to change."""
        self.changed.set()
        self.changed = trio.Event()

    async def wait_complete(self) -> None:
        """Wait until every accepted row has settled and the workers have exited.

        Cancellation: a checkpoint; nothing changes if cancelled.
        """
        while not self.complete:
            await self.changed.wait()

    # --- workers ----------------------------------------------------------------------------

    def _spawn_worker(self) -> None:
        if self._nursery is None or self._no_more_rows.is_set():
            return  # not open yet, or no row can arrive for it
        self._spawned += 1
        self.engine.spawned += 1
        self._idle += 1
        self._nursery.start_soon(self._worker, self._rows_rx.clone(), self.engine.out_tx.clone())

    async def _worker(
        self,
        rows: trio.MemoryReceiveChannel[_Job],
        outcomes: trio.MemorySendChannel[Settled],
    ) -> None:
        engine = self.engine
        try:
            while (job := await self._next_job(rows)) is not None:
                row, attempt, url = job
                engine.resident += 1
                if engine.resident > engine.max_resident:
                    engine.max_resident = engine.resident
                try:
                    outcome = await self._attempt(row, attempt, url, outcomes)
                finally:
                    engine.resident -= 1
                if type(outcome) is Landed and self.enrich is not None:
                    outcome = await self._enriched(outcome, row, outcomes)
                if outcome is not None:
                    await hand_over(outcomes, (self, outcome, row))
                self._idle += 1
        finally:
            # Closed synchronously: `async with` would checkpoint on the way out, and in a
            # cancelled worker that raises a fresh Cancelled over whatever is propagating.
            rows.close()
            outcomes.close()

    async def _next_job(self, rows: trio.MemoryReceiveChannel[_Job]) -> _Job | None:
        """Return the next row for this worker, or None once no row can come.

        Without a checkpoint when a row is ready: one offered over the channel first (it is the
        oldest), else the next lent one (`_lend`); the worker's next checkpoint is in
        `dispatch`, before anything is sent. A cancelled worker takes nothing this way: it waits
        in ``receive``, which raises `trio.Cancelled` before taking anything; so does one whose
        deadline has passed but not yet been delivered (nothing else would stop the send).
        """
        now = trio.current_time()
        if trio.current_effective_deadline() > now:
            if self._offering:
                try:
                    return rows.receive_nowait()
                except trio.WouldBlock:
                    pass
                except trio.EndOfChannel:
                    return None
            if self._ready and self._may_take(now):
                job = self._ready.popleft()
                self._idle -= 1
                self.accepted += 1
                self.engine.progress.submitted += 1
                if not self._ready:
                    self._wake_feeder()
                return job
        self._wake_feeder()  # waiting: the feeder hands this worker a row over the channel
        self._waiting += 1
        try:
            return await rows.receive()
        except trio.EndOfChannel:
            return None
        finally:
            self._waiting -= 1

    def _may_take(self, now: float) -> bool:
        """Whether a lent row may start at ``now``: admission open, the feeder's deadline not
        passed."""
        deadline = self.feed_scope.deadline
        return self.admits() and now < deadline

    async def _attempt(
        self,
        row: MaterializedRow,
        attempt: int,
        url: str,
        outcomes: trio.MemorySendChannel[Settled],
    ) -> Outcome | None:
        """Run one rollout; return its outcome, or None when it was settled here already.

        Whatever ends it other than an outcome settles it as `Omitted` (interrupted) first:
        `trio.Cancelled`, also inside an exception group (a transport waiting in a nursery of
        its own: happy eyeballs, a driver's fan-out), KeyboardInterrupt, which go on; or an
        exception from `dispatch` (a URL the transport refuses, the ledger failing before a
        re-send), which ends this pool (`Collector.fail`) rather than escaping the worker.
        """
        engine = self.engine
        start = trio.current_time()
        current = [attempt]  # the attempt in flight; a re-send moves it on
        limiter = engine.limiter
        reason = OmitReason.DRAINED  # until `dispatch` begins: nothing was sent
        try:
            # A free token is taken without a checkpoint: the task switch `async with limiter`
            # pays on every acquire is ~7 us per rollout, and `dispatch` checkpoints before
            # anything is sent, so a cancellation is still seen before the request leaves.
            began = start  # when the rollout starts: after its token, read once for all
            try:
                limiter.acquire_nowait()
            except trio.WouldBlock:
                await limiter.acquire()
                began = trio.current_time()
            try:
                window = self.window
                if not window.admits():
                    closed = window.closed_reason or "admission closed"
                    if window is engine.window:
                        engine.stop_admission(closed)  # the run's budget: every pool stops
                    else:
                        self.stop_admission(closed)  # a batch's budget: this batch stops
                    return Omitted(row.identity, attempt, OmitReason.DRAINED, 0.0)
                if not self.admits():
                    return Omitted(row.identity, attempt, OmitReason.DRAINED, 0.0)
                identity = row.identity
                first = self.reserver
                if first is not None and not (
                    self._reserve_now is not None and self._reserve_now(identity, attempt)
                ):
                    await first.reserve(((identity, attempt),))
                if self.enrich is not None:
                    await self.enrich.before(identity, attempt)
                engine.timer.started(identity, began)
                reason = OmitReason.INTERRUPTED
                return await dispatch(
                    engine.transport,
                    url,
                    row,
                    attempt,
                    engine.policy,
                    rng=engine.rng,
                    retry_state=engine.retry_state,
                    new_attempt=self._new_attempt(row, current, outcomes),
                    policy_model_server=policy_model_server_of(
                        engine.policy_servers, identity.agent_name, identity.environment_server
                    ),
                    observer=engine.observer,
                    started_at=began,
                    on_resend=self._on_resend,
                )
            finally:
                limiter.release()
        except BaseException as exc:
            elapsed = trio.current_time() - start
            omitted = Omitted(row.identity, current[0], reason, elapsed)
            await hand_over(outcomes, (self, omitted, row))
            errors, goes_on = _split_errors(exc)
            if errors is not None:
                where = f"task {row.identity.task_index} rollout {row.identity.rollout_index}"
                engine.fail(self, errors, f"{where} raised {errors!r} instead of settling")
            if goes_on is exc:
                raise  # a cancellation (bare or grouped) or an interrupt: it goes on
            if goes_on is not None:
                raise goes_on from None  # the cancellation part of a group that held errors
            return None

    async def _enriched(
        self,
        outcome: Landed,
        row: MaterializedRow,
        outcomes: trio.MemorySendChannel[Settled],
    ) -> Landed | None:
        """Return the landed outcome enriched, or None when it was settled here already.

        Exactly once: if the enrichment is cancelled (or raises), the outcome is handed over
        as `Enrich.interrupted` makes it before the exception goes on, as `_attempt` does.
        """
        assert self.enrich is not None
        try:
            return await self.enrich(outcome, row.body)
        except BaseException as exc:
            await hand_over(outcomes, (self, self.enrich.interrupted(outcome, row.body), row))
            errors, goes_on = _split_errors(exc)
            if errors is not None:
                where = f"task {row.identity.task_index} rollout {row.identity.rollout_index}"
                self.engine.fail(self, errors, f"enriching {where} raised {errors!r}")
            if goes_on is exc:
                raise
            if goes_on is not None:
                raise goes_on from None
            return None

    def _new_attempt(
        self,
        row: MaterializedRow,
        current: list[int],
        outcomes: trio.MemorySendChannel[Settled],
    ) -> NewAttempt | None:
        """Return the hook that re-sends a possibly-delivered request as a new attempt.

        None when re-sends are off, or when the next number would reach ``max_attempts``.
        """
        config = self.engine.config
        if not config.retry_requests or current[0] + 1 >= config.max_attempts:
            return None

        async def new_attempt(failed: Failed) -> int:
            # The superseded failure is recorded and the next number reserved before the
            # re-send can leave, whatever cancellation arrives meanwhile.
            await hand_over(outcomes, (self, failed, None))
            current[0] = failed.attempt_index + 1
            if self.reserver is not None:
                with trio.CancelScope(shield=True):
                    await self.reserver.reserve(((row.identity, current[0]),))
            return current[0]

        return new_attempt


Resolve = Callable[[MaterializedRow], str]


def _split_errors(exc: BaseException) -> tuple[Exception | None, BaseException | None]:
    """Split what ended a rollout into errors (its pool's) and what must go on (cancellation).

    An `Exception` is all error; a bare `trio.Cancelled` or KeyboardInterrupt all goes on; a
    group holding both (a transport's nursery cancelled while one of its tasks failed) splits,
    so the error is reported instead of vanishing or ending every batch with the worker.
    """
    if isinstance(exc, Exception):
        return exc, None
    if not isinstance(exc, BaseExceptionGroup):
        return None, exc
    errors, rest = exc.split(Exception)
    if errors is None:
        return None, exc
    return errors, rest


async def hand_over(outcomes: trio.MemorySendChannel[Settled], item: Settled) -> None:
    """Give a settled outcome to the writer; a cancellation can no longer lose it.

    A reply that woke its worker just as the run was cancelled must still be recorded:
    ``send`` would raise `trio.Cancelled` at its first checkpoint and drop it. ``send_nowait``
    has no checkpoint, and the buffer (one outcome per worker) almost always has room; when it
    has none, the send waits shielded and unbounded: the writer drains until every worker has
    exited, however slow its sink. Only a writer stopped at its own teardown deadline ends the
    wait (the channel breaks); the outcome is then lost, and the collector counts it
    (accepted, never recorded) when it exits.

    Cancellation: not a checkpoint the caller's cancellation can interrupt (see above).
    """
    try:
        try:
            outcomes.send_nowait(item)
        except trio.WouldBlock:
            with trio.CancelScope(shield=True):
                await outcomes.send(item)
    except trio.BrokenResourceError:
        pass  # the writer was stopped at its teardown deadline: counted at the collector's exit


def lend_batches(
    rows: Iterable[tuple[MaterializedRow, int] | MaterializedRow], size: int
) -> Iterator[list[tuple[MaterializedRow, int]]]:
    """Group rows (or ``(row, attempt)`` pairs) into lists of at most ``size`` pairs.

    When reading ``rows`` raises, the rows read before the error are yielded first, then the
    error is raised: a bad row never holds back the good ones before it.
    """
    pairs = ((item, 0) if isinstance(item, MaterializedRow) else item for item in rows)
    while True:
        batch: list[tuple[MaterializedRow, int]] = []
        try:
            for pair in pairs:
                batch.append(pair)
                if len(batch) == size:
                    break
        except Exception:
            if batch:
                yield batch
            raise
        if not batch:
            return
        yield batch
