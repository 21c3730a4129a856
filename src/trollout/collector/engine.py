"""The engine: one nursery per run, a feeder, N workers and one writer.

Shape (design.md, Concurrency)::

    submit()/collect() ──rows (zero-buffer)──▶ N workers ──outcomes──▶ writer ──▶ sink
                                              │ CapacityLimiter(num_samples_in_parallel)
                                              ▼ dispatch(): one POST /run → Landed | Failed

- **Workers bound memory.** At most N = ``max_resident_rollout_tasks`` (default: the
  concurrency) workers each hold at most one rollout, so memory is O(N), never O(rows). Workers
  are started on demand, when a row is handed over and none is idle, so a run never has more
  workers than rollouts (``--concurrency 1000000`` over 3 rows starts 3). The rows channel has
  no buffer, so the feeder blocks until a worker is free (back-pressure all the way to the input
  file, which is read lazily).
- **The limiter bounds requests in flight.** Workers take a token of a `trio.CapacityLimiter`
  around the request only; with more workers than tokens, the extra workers wait holding their
  row, ready to go.
- **One writer.** Workers send outcomes to a single writer task that batches what is ready and
  hands it to the sink; the sink therefore needs no lock. The outcomes channel buffers one
  outcome per worker, so a slow fsync back-pressures workers instead of growing memory. A sink
  that raises (a full disk) stops the run like `stop`: admission closes, rollouts in flight are
  cancelled, the writer keeps draining (without the sink) so no worker waits on it forever,
  and leaving the block raises the sink's error.
- **Cancellation is a scope exit.** Leaving ``open_collector``'s block early (an exception, a
  signal handler cancelling the scope) cancels the workers; each in-flight rollout turns into an
  `Omitted` (interrupted) outcome that is handed to the writer under a shield, and the writer
  drains everything already settled under a shield before the nursery exits. Nothing settled is
  lost to a cancellation; rows never taken by a worker were never started.
- **Exactly once, whatever the exit.** Every row a worker takes settles as exactly one outcome
  (Landed, Failed or Omitted) that reaches the writer, on a normal exit, a driver's exception, a
  cancelled scope, `wind_down` or `stop`: an attempt cancelled in flight sends its Omitted
  under a shield, and a finished one is handed over without a checkpoint (`_hand_over`), so a
  reply that wakes its worker in the same instant as the cancellation is never dropped.
  tests/collector/test_engine_exactly_once.py holds it for exits at random instants.
- **Stopping starts is not stopping the run.** The dispatch window (`window.DispatchWindow`:
  the budget, its drain margin) is the feeder's scope deadline plus a check after a worker took
  a slot. `stop_admission` closes it on demand; `wind_down` closes it, waits a grace period, then
  `cancel_in_flight`s the rest (signals and ``--max-run-time`` use it); `stop` does both at once
  and makes the block raise `RunStoppedError` (fail-fast and the run-level stops of `stops`).

Rejected alternative: a task per rollout (``nursery.start_soon`` for every row, gated by a
semaphore), which is NeMo Gym's shape (`as_completed` over all rows). It makes memory grow with
the input (every pending task holds its row and a coroutine frame) and makes back-pressure
impossible; a fixed pool of workers reading a channel is both bounded and cheaper per rollout.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager
from itertools import islice

import trio

from ..config import RunConfig
from ..errors import ConfigError, RunStoppedError, UnknownAgentError
from ..records import Failed, Identity, MaterializedRow, OmitReason, Omitted, Outcome
from .dispatch import DispatchPolicy, NewAttempt, dispatch
from .progress import Progress
from .retry import RetryState
from .sink import AttemptReserver, OutcomeSink
from .stops import RunStops
from .timing import RunTimer
from .transport import H11Transport, PostTransport
from .window import DispatchWindow

__all__ = ["Collector", "open_collector", "url_resolver"]

UrlResolver = Callable[[Identity], str]
_Job = tuple[MaterializedRow, int, str]  # a row, its attempt number and its /run URL
_WRITER_BATCH = 512  # outcomes handed to the sink in one call, at most
_SHIELDED_FLUSH_S = 30.0  # how long a cancelled run may spend flushing settled outcomes
_RESERVE_BATCH = 256  # attempts reserved with the sink in one call, at most


def url_resolver(urls: Mapping[str, str]) -> UrlResolver:
    """Return a resolver sending each rollout to ``urls[environment server or agent] + /run``."""
    run_urls = {name: url.rstrip("/") + "/run" for name, url in urls.items()}

    def resolve(identity: Identity) -> str:
        name = identity.environment_server or identity.agent_name
        url = run_urls.get(name or "")
        if url is None:
            known = ", ".join(sorted(run_urls)) or "none"
            raise UnknownAgentError(
                f"rollout {identity.key} goes to {name!r}, which has no URL (known: {known}); "
                "add it to open_collector(urls=...)"
            )
        return url

    return resolve


class Collector:
    """A running collection engine; obtain one from `open_collector`.

    Drivers either call `collect` once with every row (the CLI does), or `submit` rows one at a
    time and read settled outcomes with `next_outcome` / `drain_nowait` (an RL loop does).
    """

    def __init__(
        self,
        *,
        config: RunConfig,
        resolve: UrlResolver,
        transport: PostTransport,
        sink: OutcomeSink | None,
        retain_outcomes: bool,
        rng: random.Random,
        policy_model_servers: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self._policy_servers = policy_model_servers or {}
        self.progress = Progress(started_at=trio.current_time())
        self.limiter = trio.CapacityLimiter(config.num_samples_in_parallel)
        self._resolve = resolve
        self._transport = transport
        self._sink = sink
        # Attempt numbers go on record (one sink call, one ledger write and fsync, per batch)
        # before any row of the batch is handed to a worker. A fixed batch keeps that cost per
        # rollout small at any concurrency; a crash only skips the unsent numbers of one batch.
        self._reserver: AttemptReserver | None = sink if isinstance(sink, AttemptReserver) else None
        self._reserve_batch = _RESERVE_BATCH if self._reserver is not None else 1
        self._policy = DispatchPolicy.from_config(config)
        self.retry_state = RetryState.from_config(config)
        self.timer = RunTimer.from_config(config)
        self.window = DispatchWindow(
            budget_s=config.dispatch_budget_s, margin_s=config.drain_margin_s
        )
        self._stops = RunStops(config)
        self._feed_scope = trio.CancelScope()
        self._rng = rng
        self._rows_tx, self._rows_rx = trio.open_memory_channel[_Job](0)
        self._out_tx, self._out_rx = trio.open_memory_channel[Outcome](config.resident_rollouts)
        self._retain = retain_outcomes
        self._unconsumed: deque[Outcome] = deque()
        self._settled_event = trio.Event()
        self._writer_done = trio.Event()
        self._resident = 0
        self.max_resident = 0
        self._workers: trio.Nursery | None = None
        self._spawned = 0  # workers started so far
        self._spawning_closed = False
        self._idle = 0  # workers ready for a row: waiting, or started and about to wait
        self.sink_error: Exception | None = None
        self.stop_reason: str | None = None
        self._run_scope: trio.CancelScope | None = None
        self._writer_scope = trio.CancelScope(shield=True)

    @property
    def in_flight(self) -> int:
        """Requests in flight now (tokens borrowed from the limiter)."""
        return self.limiter.borrowed_tokens

    async def submit(self, row: MaterializedRow, attempt_index: int = 0) -> None:
        """Hand one rollout attempt to the workers, waiting until a worker takes it.

        Cancellation: a checkpoint; if cancelled, the row was not taken and nothing was sent.
        """
        await self._reserve([(row, attempt_index)])
        await self._send(row, attempt_index)

    async def collect(
        self, rows: Iterable[tuple[MaterializedRow, int] | MaterializedRow]
    ) -> Progress:
        """Submit every row (or ``(row, attempt)``), then wait until each has settled.

        Returns the run's `Progress`. Closes the input: `submit` cannot be called afterwards.

        Cancellation: a checkpoint between rows; rows not yet submitted were never started, and
        every rollout in flight settles as `Omitted` through the writer.
        """
        self._begin()
        # The feeder's scope is the dispatch window: its deadline is the budget's end, and
        # stop_admission cancels it; either way rows not yet handed out are never started.
        self._feed_scope.deadline = self.window.deadline
        async with self._rows_tx:
            with self._feed_scope:
                for batch in _batches(rows, self._reserve_batch):
                    await self._reserve(batch)
                    for row, attempt in batch:
                        await self._send(row, attempt)
        self._close_spawning()
        if self._feed_scope.cancelled_caught and self.window.closed_reason is None:
            self.window.close(self.window.spent_reason)  # the feeder's deadline passed
        await self._writer_done.wait()
        return self.progress

    async def next_outcome(self) -> Outcome:
        """Wait for and return the oldest settled outcome not yet consumed.

        Raises:
            ConfigError: the collector does not keep outcomes (``retain_outcomes=False``),
                so the wait could never end.
            trio.EndOfChannel: every outcome has settled and been consumed.

        Cancellation: a checkpoint; a cancelled wait consumes nothing.
        """
        if not self._retain:
            raise ConfigError(
                "next_outcome() needs open_collector(..., retain_outcomes=True): this collector "
                "hands outcomes only to its sink"
            )
        while not self._unconsumed:
            if self._writer_done.is_set():
                raise trio.EndOfChannel("the collector has settled every outcome")
            await self._settled_event.wait()
        return self._unconsumed.popleft()

    def drain_nowait(self) -> list[Outcome]:
        """Return (and consume) every settled outcome not yet consumed."""
        out = list(self._unconsumed)
        self._unconsumed.clear()
        return out

    def stop(self, reason: str) -> None:
        """Stop the run as failed: cancel every rollout in flight (they settle as omitted).

        Leaving `open_collector`'s block then raises `RunStoppedError` with `reason`.
        """
        self.stop_reason = reason
        self.stop_admission(reason)
        self.cancel_in_flight(reason)

    def stop_admission(self, reason: str) -> None:
        """Start no new rollout from now on; rollouts in flight go on.

        Rows handed to `collect` but not yet started are never started (resume re-runs them);
        a row a worker already holds settles as `Omitted` (drained).
        """
        self.window.close(reason)
        self._feed_scope.cancel(reason=reason)

    def cancel_in_flight(self, reason: str) -> None:
        """Cancel every rollout in flight now; each settles as `Omitted` (interrupted)."""
        self.stop_admission(reason)
        if self._run_scope is not None:
            self._run_scope.cancel(reason=reason)

    async def wind_down(self, reason: str, *, grace_s: float) -> None:
        """Stop admission, give rollouts in flight `grace_s` seconds, then cancel the rest.

        This is how a signal or ``--max-run-time`` ends a run: everything that finishes within
        the grace period is recorded as usual, the rest as omitted, and the folder stays
        resumable.

        Cancellation: a checkpoint; if cancelled, admission is closed and nothing else changed.
        """
        self.stop_admission(reason)
        with trio.move_on_after(grace_s):
            while self.progress.settled < self.progress.submitted:
                await self._settled_event.wait()
            return
        self.cancel_in_flight(f"{reason}; the grace period of {grace_s:g} s ended")

    # --- tasks ------------------------------------------------------------------------------

    def _begin(self) -> None:
        if self.window.started_at is None:
            self.window.begin()
            self.timer.mark_dispatch_start()

    async def _reserve(self, batch: list[tuple[MaterializedRow, int]]) -> None:
        if self._reserver is not None and batch:
            await self._reserver.reserve([(row.identity, attempt) for row, attempt in batch])

    async def _send(self, row: MaterializedRow, attempt_index: int) -> None:
        # Resolved here, in the caller's task: an unknown agent is the caller's error, raised
        # to it alone, not a crash of a worker inside the run's nurseries.
        url = self._resolve(row.identity)
        self._begin()
        if self._idle == 0 and self._spawned < self.config.resident_rollouts:
            self._spawn_worker()
        await self._rows_tx.send((row, attempt_index, url))
        self._idle -= 1  # counted here: the worker that took it may not have run yet
        self.progress.submitted += 1

    def _spawn_worker(self) -> None:
        if self._workers is None or self._spawning_closed:
            return  # not open yet, or admission is over: no row can arrive for it
        self._spawned += 1
        self._idle += 1
        self._workers.start_soon(self._worker, self._rows_rx.clone(), self._out_tx.clone())

    def _close_spawning(self) -> None:
        """Close the channel ends kept for starting workers (no more rows can come)."""
        self._spawning_closed = True
        self._rows_rx.close()
        self._out_tx.close()

    async def _worker(
        self,
        rows: trio.MemoryReceiveChannel[_Job],
        outcomes: trio.MemorySendChannel[Outcome],
    ) -> None:
        async with rows, outcomes:
            async for row, attempt, url in rows:
                self._resident += 1
                self.max_resident = max(self.max_resident, self._resident)
                try:
                    outcome = await self._attempt(row, attempt, url, outcomes)
                finally:
                    self._resident -= 1
                await _hand_over(outcomes, outcome)
                self._idle += 1

    async def _attempt(
        self,
        row: MaterializedRow,
        attempt: int,
        url: str,
        outcomes: trio.MemorySendChannel[Outcome],
    ) -> Outcome:
        start = trio.current_time()
        current = [attempt]  # the attempt in flight; a re-send moves it on
        try:
            async with self.limiter:
                if not self.window.admits():
                    self.stop_admission(self.window.closed_reason or "admission closed")
                    return Omitted(row.identity, attempt, OmitReason.DRAINED, 0.0)
                self.timer.started(row.identity)
                who = row.identity.agent_name or row.identity.environment_server or ""
                return await dispatch(
                    self._transport,
                    url,
                    row,
                    attempt,
                    self._policy,
                    rng=self._rng,
                    retry_state=self.retry_state,
                    new_attempt=self._new_attempt(row, current, outcomes),
                    policy_model_server=self._policy_servers.get(who),
                )
        except trio.Cancelled:
            elapsed = trio.current_time() - start
            omitted = Omitted(row.identity, current[0], OmitReason.INTERRUPTED, elapsed)
            # The writer is shielded and alive until every worker has exited, so this send
            # completes; the bound only guards against a sink that hangs.
            with trio.CancelScope(shield=True), trio.move_on_after(_SHIELDED_FLUSH_S):
                await outcomes.send(omitted)
            raise

    def _new_attempt(
        self,
        row: MaterializedRow,
        current: list[int],
        outcomes: trio.MemorySendChannel[Outcome],
    ) -> NewAttempt | None:
        """Return the hook that re-sends a possibly-delivered request as a new attempt."""
        if not self.config.retry_requests:
            return None

        async def new_attempt(failed: Failed) -> int:
            # The superseded failure is recorded and the next number reserved before the
            # re-send can leave, whatever cancellation arrives meanwhile.
            with trio.CancelScope(shield=True):
                await outcomes.send(failed)
                current[0] = failed.attempt_index + 1
                await self._reserve([(row, current[0])])
            return current[0]

        return new_attempt

    async def _writer(self) -> None:
        # Shielded: the writer outlives a cancellation until every worker has exited (they close
        # the channel), so each settled outcome, including the omitted ones, reaches the sink.
        # open_collector bounds the shield with a deadline when the run is being torn down.
        with self._writer_scope:
            async with self._out_rx:
                async for first in self._out_rx:
                    batch = [first]
                    while len(batch) < _WRITER_BATCH:
                        try:
                            batch.append(self._out_rx.receive_nowait())
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                    await self._settle(batch)
        self._writer_done.set()
        self._wake_consumers()

    async def _settle(self, batch: list[Outcome]) -> None:
        for outcome in batch:
            self.progress.record(outcome)
            self.timer.finished(outcome)
            if type(outcome) is not Omitted:
                self.window.finished(outcome.elapsed_seconds)
            reason = self._stops.check(outcome)
            if reason is not None and self.stop_reason is None:
                self.stop(reason)
        if self._sink is not None and self.sink_error is None:
            try:
                await self._sink.write(batch)
            except Exception as exc:  # any sink's failure ends the run, never the writer
                self.sink_error = exc
                self.stop(f"the outcomes could not be written: {exc}")
        if self._retain:
            self._unconsumed.extend(batch)
        self._wake_consumers()

    def _wake_consumers(self) -> None:
        self._settled_event.set()
        self._settled_event = trio.Event()


@asynccontextmanager
async def open_collector(
    *,
    config: RunConfig | None = None,
    urls: Mapping[str, str] | None = None,
    resolve: UrlResolver | None = None,
    sink: OutcomeSink | None = None,
    transport: PostTransport | None = None,
    retain_outcomes: bool = False,
    seed: int | None = None,
    policy_model_servers: Mapping[str, str] | None = None,
) -> AsyncIterator[Collector]:
    """Open a collection engine: workers and a writer inside one nursery.

    Args:
        config: run settings (concurrency, timeouts, retries); defaults when None.
        urls: ``{agent or environment server name: base URL}``; each rollout goes to
            ``urls[identity.environment_server or identity.agent_name] + "/run"``.
        resolve: instead of `urls`, a function from a rollout's `Identity` to its full URL.
        sink: where the writer hands settled outcomes (`recovery.store.RunStore` for a run
            folder); None keeps nothing unless `retain_outcomes`.
        transport: the `/run` transport; one is opened (and closed on exit) when None.
        retain_outcomes: keep settled outcomes for `Collector.next_outcome` / `drain_nowait`.
        seed: seeds the retry jitter (tests); None draws from the OS.
        policy_model_servers: ``{agent or environment server name: model server name}``;
            each outcome is stamped ``ng_policy_model_server`` from its agent, else its
            environment server (`Deployment.policy_model_servers`).

    On a normal exit the block waits for every submitted rollout to settle. On an exception, or
    when the surrounding scope is cancelled, rollouts in flight are cancelled and settle as
    `Omitted`; the writer flushes every settled outcome to the sink before the block exits.

    Cancellation: entering is not a checkpoint that loses anything; see above for exit.
    """
    config = config or RunConfig()
    if resolve is None:
        if urls is None:
            raise TypeError("open_collector needs urls= or resolve=")
        resolve = url_resolver(urls)
    own_transport = transport is None
    if transport is None:
        transport = H11Transport(
            connect_timeout_s=config.connect_timeout_s,
            read_timeout_s=config.read_timeout_s,
            reply_timeout_s=config.reply_timeout_s,
            max_body_bytes=config.max_reply_bytes,
        )
    collector = Collector(
        config=config,
        resolve=resolve,
        transport=transport,
        sink=sink,
        retain_outcomes=retain_outcomes,
        rng=random.Random(seed),
        policy_model_servers=policy_model_servers,
    )
    driver_error: Exception | None = None
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collector._writer)
            try:
                async with trio.open_nursery() as workers:
                    collector._run_scope = workers.cancel_scope
                    collector._workers = workers
                    try:
                        yield collector
                    except Exception as exc:
                        # The driver's own error: cancel the run, flush, and re-raise it as it
                        # was, not wrapped in the nurseries' exception groups.
                        driver_error = exc
                        workers.cancel_scope.cancel(reason=f"the driver raised {exc!r}")
                    else:
                        collector._rows_tx.close()
                    finally:
                        collector._close_spawning()
            except BaseException:
                # A cancellation or a crash: bound the writer's final, shielded flush.
                collector._writer_scope.deadline = trio.current_time() + _SHIELDED_FLUSH_S
                raise
            finally:
                if driver_error is not None:
                    collector._writer_scope.deadline = trio.current_time() + _SHIELDED_FLUSH_S
                with trio.CancelScope(shield=True):
                    await collector._writer_done.wait()
    finally:
        if own_transport:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await transport.aclose()
    if driver_error is not None:
        raise driver_error
    if collector.sink_error is not None:
        raise collector.sink_error
    if collector.stop_reason is not None:
        raise RunStoppedError(collector.stop_reason)


async def _hand_over(outcomes: trio.MemorySendChannel[Outcome], outcome: Outcome) -> None:
    """Give a settled outcome to the writer; a cancellation can no longer lose it.

    A reply that woke its worker just as the run was cancelled must still be recorded:
    ``send`` would raise `trio.Cancelled` at its first checkpoint and drop it. ``send_nowait``
    has no checkpoint, and the buffer (one outcome per worker) almost always has room; when it
    has none, the send waits shielded, since the writer drains until every worker has exited.
    """
    try:
        outcomes.send_nowait(outcome)
    except trio.WouldBlock:
        with trio.CancelScope(shield=True), trio.move_on_after(_SHIELDED_FLUSH_S):
            await outcomes.send(outcome)


def _batches(
    rows: Iterable[tuple[MaterializedRow, int] | MaterializedRow], size: int
) -> Iterator[list[tuple[MaterializedRow, int]]]:
    """Group rows (or ``(row, attempt)`` pairs) into lists of at most ``size`` pairs."""
    pairs = ((item, 0) if isinstance(item, MaterializedRow) else item for item in rows)
    while batch := list(islice(pairs, size)):
        yield batch
