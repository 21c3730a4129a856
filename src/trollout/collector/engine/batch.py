"""Batches on a long-lived collector: what a training loop sends at each step.

``async with collector.open_batch(rows) as batch: async for item in batch: ...`` dispatches the
rows on the collector's shared limiter, transport and writer, in a worker pool of the batch's
own (`pool.Pool`), and yields a `BatchOutcome` per row in completion order: the rollout's
final outcome, the row as dispatched (an invocation-owned copy) and the batch's run id.

Leaving the block closes the batch (`Batch.aclose`): rows not yet started never start, rollouts
in flight are cancelled and settle as `Omitted`, and the block waits until every accepted row
has reached the sink. Only this batch's workers are cancelled: never the caller's code, never
another batch, never the collector. `Batch.aclose_and_drain` closes the same way and returns
what settled but was not consumed; `Batch.stop_admission` lets rollouts in flight finish.

The dispatch budget (``dispatch_budget_s``) counts per batch, from its opening: each batch's
pool has a window of its own (`window.DispatchWindow.for_batch`; its design note says why).

Rollout ids: each row is copied and stamped with the batch's run id (`run_ids.RowStamper`),
unless they are `StampedRows` of the batch's run id (a recorded shard's rows, stamped once;
`run_ids` says why); the names of `run_ids` are re-exported here, where the
front ends import them from.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Protocol

import trio
from attrs import frozen

from ...records import (
    Identity,
    Landed,
    MaterializedRow,
    Omitted,
    Outcome,
)
from .pool import SHIELDED_FLUSH_S, Pool, PoolHost
from .run_ids import (
    BatchRows,
    RowStamper,
    StampedRows,
    check_run_id,
    new_run_id,
    shard_rollout_id,
)
from .sink import AttemptReserver, OutcomeSink

__all__ = [
    "Batch",
    "BatchHost",
    "BatchOutcome",
    "BatchRows",
    "RowStamper",
    "StampedRows",
    "check_run_id",
    "new_run_id",
    "open_batch",
    "shard_rollout_id",
]


@frozen
class BatchOutcome:
    """One rollout of a batch, settled.

    Attributes:
        row: the row as dispatched (stamped with the run id and the prefixed rollout id); a copy
            the caller owns and may change or feed to another batch.
        outcome: the rollout's final outcome: `Landed`, `Failed` or `Omitted`.
        run_id: the batch's run id (a recorded shard's manifest carries the same).
    """

    row: dict[str, Any]
    outcome: Outcome
    run_id: str

    @property
    def landed(self) -> bool:
        """Whether the rollout returned a result."""
        return type(self.outcome) is Landed

    @property
    def result(self) -> Mapping[str, Any] | None:
        """The server's result (without the collector's stamps), or None when not landed."""
        return self.outcome.result if type(self.outcome) is Landed else None

    @property
    def reward(self) -> float | None:
        """The result's top-level ``reward``, or None (not landed, or unscored)."""
        return self.outcome.reward if type(self.outcome) is Landed else None


class BatchHost(PoolHost, Protocol):
    """What a batch uses of its collector (`collector.Collector`), beyond what its pool does.

    A batch hosts its pool in the collector (`start_pool`, `forget_pool`), sends to the
    collector's sink unless given its own, resolves URLs with the collector's resolver and
    starts the run's dispatch clock (`begin_dispatch`). Naming exactly this keeps the batch
    from importing the collector, which opens batches: no import cycle between the two.
    """

    sink: OutcomeSink | None
    resolve: Callable[[Identity], str]

    async def start_pool(self, pool: Pool) -> None:
        """Host ``pool``'s workers in the collector's nursery."""
        ...

    def forget_pool(self, pool: Pool) -> None:
        """Drop a completed pool."""
        ...

    def begin_dispatch(self) -> None:
        """Start the dispatch window and the run's clock, once."""
        ...


class Batch:
    """A batch of rollouts in flight on a collector; open one with `Collector.open_batch`.

    Iterate it (``async for item in batch``) for a `BatchOutcome` per row, in completion order;
    the iteration ends when every row has settled.

    Attributes:
        run_id: the batch's run id (prefix of its rollout ids).
    """

    def __init__(
        self,
        collector: BatchHost,
        *,
        run_id: str,
        sink: OutcomeSink | None,
    ) -> None:
        self.run_id = run_id
        self._collector = collector
        target = sink if sink is not None else collector.sink
        reserver = target if isinstance(target, AttemptReserver) else None
        self.pool = Pool(
            collector,
            sink=target,
            reserver=reserver,
            deliver=self._take,
            window=collector.window.for_batch(),
        )
        self._pending: deque[BatchOutcome] = deque()
        self._consumed = 0
        self._error: Exception | None = None  # the rows failed (a bad row, an unknown agent)
        self._reported: list[Exception] = []  # failures the consumer has been raised
        self._closing = False
        self._closed = False

    @property
    def accepted(self) -> int:
        """Rows the batch has taken so far."""
        return self.pool.accepted

    @property
    def settled(self) -> int:
        """Rows whose final outcome reached the sink."""
        return self.pool.settled

    @property
    def consumed(self) -> int:
        """Outcomes handed to the consumer so far."""
        return self._consumed

    def __aiter__(self) -> Batch:
        return self

    async def __anext__(self) -> BatchOutcome:
        """Return the next settled outcome, in completion order.

        Each error is raised once; iterating on yields what else settles, so the outcomes of
        the rows that went out are never lost to the error.

        Raises:
            StopAsyncIteration: every row has settled and been consumed, or the batch closed.
            InputError, UnknownAgentError, ConfigError: a row could not be dispatched (the
                rows before it went out; none after it).
            Exception: the batch's own sink failed (a recorded shard's disk), or a rollout
                raised instead of settling (its row settled as omitted, the batch was
                cancelled).

        Cancellation: a checkpoint; a cancelled wait consumes nothing.
        """
        while True:
            self._raise_failure()
            if self._pending:
                self._consumed += 1
                return self._pending.popleft()
            if self._closed or self.pool.complete:
                raise StopAsyncIteration
            await self.pool.changed.wait()

    def ready_nowait(self) -> list[BatchOutcome]:
        """Return (and consume) every outcome settled and not yet consumed, without waiting."""
        ready = list(self._pending)
        self._pending.clear()
        self._consumed += len(ready)
        return ready

    def stop_admission(self, reason: str = "the batch stopped admission") -> None:
        """Start no more of this batch's rows; those in flight go on and are still yielded."""
        self.pool.stop_admission(reason)

    async def aclose(self) -> None:
        """Close the batch: cancel its unfinished rollouts and wait until every one settled.

        Rows not yet started never start; rollouts in flight settle as `Omitted` (interrupted).
        Iteration stops. Calling it again does nothing.

        Cancellation: shielded (bounded by 30 s): when this returns or raises, every rollout
        the batch accepted has reached the sink. Nothing outside the batch is cancelled.
        """
        if self._closed:
            return
        self._closing = True
        self.pool.cancel("the batch was closed")
        if not self.pool.complete:  # a scope with a deadline lingers in Trio's deadline heap
            with trio.CancelScope(shield=True), trio.move_on_after(SHIELDED_FLUSH_S):
                await self.pool.wait_complete()
        self._closed = True
        self._collector.forget_pool(self.pool)

    async def aclose_and_drain(self) -> list[BatchOutcome]:
        """Close the batch (as `aclose`) and return what settled but was not consumed.

        The rollouts this call interrupted, or kept from starting, are not returned (they reach
        the sink as omitted); everything else that settled, before or while closing, is, once.
        A second call returns an empty list.

        Cancellation: as `aclose`.
        """
        await self.aclose()
        drained = list(self._pending)
        self._pending.clear()
        self._consumed += len(drained)
        return drained

    # --- internals --------------------------------------------------------------------------

    async def feed(self, rows: Iterable[MaterializedRow]) -> None:
        """Offer the batch's rows; an error ends admission and is raised to the consumer."""
        try:
            self.pool.feed_scope.deadline = self.pool.window.deadline
            await self.pool.feed(((row, 0) for row in rows), _resolver(self._collector))
        except Exception as exc:  # a bad row or an unknown agent: the consumer's error
            self._error = exc
            self.pool.stop_admission(f"the batch's rows failed: {exc!r}")
        finally:
            self.pool.close_rows()
            self.pool.wake()

    def raise_unreported(self) -> None:
        """Raise the batch's error if the consumer has not seen it yet."""
        self._raise_failure()

    def _raise_failure(self) -> None:
        """Raise the first failure (the rows', then the pool's) not raised to the consumer yet."""
        for failure in (self._error, self.pool.error):
            if failure is not None and not any(failure is seen for seen in self._reported):
                self._reported.append(failure)
                raise failure

    def _take(self, pool: Pool, settled: list[tuple[Outcome, MaterializedRow | None]]) -> None:
        for outcome, row in settled:
            if row is None:
                continue  # an attempt superseded by a new one: in the sink, not the rollout's end
            if self._closing and type(outcome) is Omitted:
                continue  # cut short (or never started) by the consumer's close: in the sink
            body = row.body
            assert isinstance(body, dict)
            self._pending.append(BatchOutcome(body, outcome, self.run_id))


def _resolver(collector: BatchHost) -> Any:
    resolve = collector.resolve
    return lambda row: resolve(row.identity)


@asynccontextmanager
async def open_batch(
    collector: BatchHost,
    rows: BatchRows,
    *,
    run_id: str | None = None,
    sink: OutcomeSink | None = None,
    enrich_results: bool = True,
) -> AsyncIterator[Batch]:
    """Open a batch of rollouts on a collector; leaving the block closes it (`Batch.aclose`).

    Args:
        collector: the long-lived collector whose limiter, transport and writer it shares.
        rows: materialized rows (`plan_rows`), or rows an earlier batch returned; each is
            copied and stamped (module docstring), but `StampedRows` of this run id, which
            are dispatched as they are (`run_ids`). Read lazily, as workers free up.
        run_id: the batch's run id (default: a fresh one); it prefixes every rollout id.
        sink: where the batch's outcomes go (default: the collector's sink).
        enrich_results: enrich each landed outcome as the collector does (False: as replied).

    Raises:
        ConfigError: ``run_id`` cannot prefix rollout ids.
        RunStoppedError: the collector's run was stopped.
        InputError, UnknownAgentError, ConfigError: a row could not be dispatched; raised
            from the iteration (once), or at exit if not iterated.
        Exception: what else ended the batch (its sink failed, a rollout raised): as above.

    Cancellation: entering is a checkpoint (nothing started if cancelled). Exit is shielded
    (bounded by 30 s): every row the batch accepted has settled and reached its sink when the
    block is left, however it is left.
    """
    batch = Batch(
        collector,
        run_id=check_run_id(run_id) if run_id is not None else new_run_id(),
        sink=sink,
    )
    if not enrich_results:
        batch.pool.enrich = None
    stamped = type(rows) is StampedRows and rows.run_id == batch.run_id
    taken = rows if stamped else RowStamper(batch.run_id).all(rows)
    await collector.start_pool(batch.pool)
    collector.begin_dispatch()
    batch.pool.window.begin()  # the batch's budget counts from here (`window.for_batch`)
    batch.pool.start_soon(batch.feed, taken)
    try:
        yield batch
    finally:
        await batch.aclose()
    batch.raise_unreported()
