# Stays whole: the collector's exits (stop, cancel, wind down, the block's own exit) and its
# single writer act on one set of state; the pools and batches live in `pool` and `batch`.
"""The engine: one nursery per collector, worker pools, and one writer.

Shape (docs/design.md, Concurrency)::

    submit()/collect() ──rows (zero-buffer)──▶ pool: N workers ──┐
    open_batch(rows) ──feeder──▶ batch pool: N workers ───────────┼─outcomes─▶ writer ─▶ sinks
                                  │ CapacityLimiter(num_samples_in_parallel), shared        │
                                  ▼ dispatch(): one POST /run → Landed | Failed             ▼
                                                                      the pool's consumer

- **Workers bound memory.** Each pool (`pool.Pool`: the collector's own for `submit`/`collect`,
  one per open batch) runs at most N = ``max_resident_rollout_tasks`` (default: the concurrency)
  workers, each holding one rollout, started on demand; the feeder lends them one batch of rows
  at a time (`Pool.feed`), which a worker that finishes takes from without a task switch, and
  takes no more input until the batch is taken (back-pressure all the way to the input).
- **The limiter bounds requests in flight,** across every pool: workers take a token of one
  `trio.CapacityLimiter` around the request only.
- **One writer.** Workers send outcomes to a single writer task that batches what is ready,
  hands each pool's outcomes to that pool's sink (so no sink needs a lock) and then to the pool
  (a batch's consumer, the retained outcomes). The outcomes channel buffers one outcome per
  worker of a pool, so a slow fsync back-pressures workers instead of growing memory. A sink that
  raises (a full disk) ends what it serves: the collector's own sink stops the run like `stop`;
  a batch's own sink (a recorded shard) cancels that batch, which raises the error at its exit.
  The writer keeps draining (without the failed sink), so no worker waits on it forever. An
  exception from `dispatch` itself ends its pool the same way (`fail`), after its row settled.
  Workers wait for the writer however slow its sink while the collector is live; only when the
  block is left early is the writer's flush bounded (30 s), and what it could not record is
  counted (`unrecorded`) and logged.
- **URLs are checked where they are resolved.** A static ``urls`` map is checked when the
  collector opens; every URL a resolver returns is checked before its row is accepted
  (`dispatch.check_run_url`), so an ``https://`` agent is the caller's error, raised once.
- **Cancellation is a scope exit, and only of its own scope.** Pools live in tasks of the
  collector's nursery, not around the driver's code: `cancel_in_flight` and an early batch exit
  cancel workers, never the driver. Leaving ``open_collector``'s block early (an exception, a
  cancelled scope) cancels every pool; `stop` (a run-level failure) cancels the driver's block
  too. Each in-flight rollout turns into an `Omitted` (interrupted) outcome handed to the writer
  under a shield, and the writer drains everything settled under a shield before the nursery
  exits. Rows never taken by a worker were never started.
- **Exactly once, whatever the exit.** Every row a pool accepts settles as exactly one final
  outcome (Landed, Failed or Omitted) that reaches the writer and its sink, on a normal exit, a
  driver's exception, a cancelled scope, KeyboardInterrupt, `wind_down`, `stop` or a batch's
  early close: an attempt cancelled in flight sends its Omitted under a shield, a finished one
  is handed over without a checkpoint (`pool.hand_over`), so a reply that wakes its worker in
  the same instant as the cancellation is never dropped, and a row offered after admission
  closed settles as drained at the door. tests/collector/engine/test_engine_exactly_once.py and
  tests/collector/engine/test_batch_exits.py hold it for exits at random instants.
- **Stopping starts is not stopping the run.** The dispatch window (`window.DispatchWindow`:
  the budget, its drain margin) is the feeders' scope deadline plus a check after a worker took
  a slot. `stop_admission` closes it on demand; `wind_down` closes it, waits a grace period, then
  `cancel_in_flight`s the rest (signals and ``--max-run-time`` use it); `stop` does both at once
  and makes the block raise `RunStoppedError` (fail-fast and the run-level stops of `stops`).

Rejected alternative: a task per rollout (``nursery.start_soon`` for every row, gated by a
semaphore), which is NeMo Gym's shape (`as_completed` over all rows). It makes memory grow with
the input (every pending task holds its row and a coroutine frame) and makes back-pressure
impossible; a fixed pool of workers reading a channel is both bounded and cheaper per rollout.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING

import trio

from ...enrichment import Enricher, EnrichmentOptions
from ...errors import ConfigError, RunStoppedError, UnknownAgentError
from ...records import Identity, MaterializedRow, Omitted, Outcome
from ...settings import RunConfig
from ..dispatch.request import DispatchPolicy, check_run_url
from ..dispatch.retry import RetryState
from ..http.transport import Http11Transport, PostTransport
from .observer import Guarded, Observer
from .pool import SHIELDED_FLUSH_S, Enrich, Pool, Settled
from .progress import Progress
from .sink import AttemptReserver, OutcomeSink
from .stops import RunStops
from .timing import RunTimer
from .window import DispatchWindow

if TYPE_CHECKING:
    from .batch import Batch, BatchRows

__all__ = ["Collector", "enricher_for", "open_collector", "url_resolver"]

UrlResolver = Callable[[Identity], str]
_WRITER_BATCH = 512  # outcomes handed to the sinks in one round, at most
_CHECKED_URLS = 4096  # resolved URLs remembered as sendable, at most (a resolver may vary them)
_log = logging.getLogger(__name__)


def url_resolver(urls: Mapping[str, str]) -> UrlResolver:
    """Return a resolver sending each rollout to ``urls[environment server or agent] + /run``.

    Raises:
        ConfigError: a URL the `/run` transport cannot send to (``https://``, no host).
    """
    run_urls = {
        name: check_run_url(url, what=f"open_collector(urls=...)'s URL for {name!r}").rstrip("/")
        + "/run"
        for name, url in urls.items()
    }

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


def checked(resolve: UrlResolver) -> UrlResolver:
    """Return ``resolve``, raising ConfigError for a URL the `/run` transport cannot send to.

    Each distinct URL is checked once (up to a bound), so the check costs a set lookup per row.
    """
    sendable: set[str] = set()

    def checked_resolve(identity: Identity) -> str:
        url = resolve(identity)
        if url not in sendable:
            what = f"the /run URL of task {identity.task_index} rollout {identity.rollout_index}"
            check_run_url(url, what=what)
            if len(sendable) < _CHECKED_URLS:
                sendable.add(url)
        return url

    return checked_resolve


class Collector:
    """A running collection engine; obtain one from `open_collector`.

    Drivers either call `collect` once with every row (the CLI does), `submit` rows one at a
    time and read settled outcomes with `next_outcome` / `drain_nowait`, or open batches
    (`open_batch`) on a collector kept across the steps of a training loop.
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
        observer: Observer | None = None,
        enrich: Enrich | None = None,
    ) -> None:
        self.config = config
        self.enrich = enrich  # applied by every pool's workers to each landed outcome
        self.observer = observer
        self.policy_servers = policy_model_servers or {}
        self.progress = Progress(started_at=trio.current_time())
        self.limiter = trio.CapacityLimiter(config.num_samples_in_parallel)
        self.resolve = checked(resolve)
        self.transport = transport
        self.sink = sink
        self.policy = DispatchPolicy.from_config(config)
        self.retry_state = RetryState.from_config(config)
        self.timer = RunTimer.from_config(config)
        self.window = DispatchWindow(
            budget_s=config.dispatch_budget_s, margin_s=config.drain_margin_s
        )
        self.rng = rng
        self._stops = RunStops(config)
        self.out_tx, self._out_rx = trio.open_memory_channel[Settled](config.resident_rollouts)
        self._retain = retain_outcomes
        self._unconsumed: deque[Outcome] = deque()
        # A worker puts its attempt's number on record (one sink call, one ledger write) right
        # before sending it (pool.py): a crash spends no number of a row that was not sent.
        reserver = sink if isinstance(sink, AttemptReserver) else None
        self._own = Pool(self, sink=sink, reserver=reserver, deliver=self._retained)
        self._pools: set[Pool] = {self._own}
        self.resident = 0
        self.max_resident = 0
        self.spawned = 0  # workers started so far, every pool
        self.sink_error: Exception | None = None  # the collector's sink failed: not written to
        self.error: Exception | None = None  # what stopped the run, raised when the block exits
        self.stop_reason: str | None = None
        self.finals = 0  # final outcomes the writer handed on (rows settled), every pool
        self.unrecorded = 0  # accepted rows never settled: the torn-down writer stopped first
        self._nursery: trio.Nursery | None = None
        self._writer_scope = trio.CancelScope(shield=True)
        self._writer_done = trio.Event()
        self._changed = trio.Event()  # set (and replaced) after every round of the writer

    @property
    def in_flight(self) -> int:
        """Requests in flight now (tokens borrowed from the limiter)."""
        return self.limiter.borrowed_tokens

    @property
    def _spawned(self) -> int:
        return self.spawned

    async def submit(self, row: MaterializedRow, attempt_index: int = 0) -> None:
        """Hand one rollout attempt to the workers, waiting until a worker takes it.

        After admission closed (`stop_admission`, `wind_down`, the budget) the row settles at
        once as `Omitted` (drained): it is accepted, never started.

        Raises:
            UnknownAgentError: the row's agent has no URL; nothing was sent.
            ConfigError: the row's URL cannot be sent to (``https://``); nothing was sent.

        Cancellation: a checkpoint; if cancelled, the row was not taken and nothing was sent.
        """
        url = self.resolve(row.identity)
        self.begin_dispatch()
        await self._own.offer(row, attempt_index, url)

    async def collect(
        self, rows: Iterable[tuple[MaterializedRow, int] | MaterializedRow]
    ) -> Progress:
        """Submit every row (or ``(row, attempt)``), then wait until each has settled.

        Returns the run's `Progress`. Closes the input: `submit` cannot be called afterwards.

        Raises:
            UnknownAgentError: a row's agent has no URL (the rows before it still settle).
            ConfigError: a row's URL cannot be sent to (the rows before it still settle).

        Cancellation: a checkpoint between rows; rows not yet submitted were never started, and
        every rollout in flight settles as `Omitted` through the writer.
        """
        self.begin_dispatch()
        pool = self._own
        # The feeder's scope is the dispatch window: its deadline is the budget's end, and
        # stop_admission cancels it; either way rows not yet handed out are never started.
        pool.feed_scope.deadline = self.window.deadline
        try:
            await pool.feed(rows, lambda row: self.resolve(row.identity))
        finally:
            pool.close_rows()
        if pool.feed_scope.cancelled_caught and self.window.closed_reason is None:
            self.window.close(self.window.spent_reason)  # the feeder's deadline passed
        await pool.wait_complete()
        return self.progress

    def open_batch(
        self,
        rows: BatchRows,
        *,
        run_id: str | None = None,
        sink: OutcomeSink | None = None,
        enrich_results: bool = True,
    ) -> AbstractAsyncContextManager[Batch]:
        """Open a batch of rollouts: ``async with collector.open_batch(rows) as batch``.

        See `batch.open_batch` (the arguments, the outcomes it yields, how it closes).
        """
        from .batch import open_batch

        return open_batch(self, rows, run_id=run_id, sink=sink, enrich_results=enrich_results)

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
            if self._own.complete:
                raise trio.EndOfChannel("the collector has settled every outcome")
            await self._own.changed.wait()
        return self._unconsumed.popleft()

    def drain_nowait(self) -> list[Outcome]:
        """Return (and consume) every settled outcome not yet consumed."""
        out = list(self._unconsumed)
        self._unconsumed.clear()
        return out

    def stop(self, reason: str) -> None:
        """Stop the run as failed: cancel every rollout in flight (they settle as omitted).

        The driver's block is cancelled too; leaving it raises `RunStoppedError` with `reason`.
        """
        self.stop_reason = reason
        self.cancel_in_flight(reason)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel(reason=reason)

    def fail(self, pool: Pool, exc: Exception, reason: str, *, whole_run: bool = False) -> None:
        """End ``pool`` with ``exc``, which its consumer raises; the rows it accepted settle.

        A batch's pool is cancelled and the batch raises ``exc``; the collector's own pool (or
        ``whole_run``: the collector's sink failed) stops the run, and the block raises ``exc``.
        """
        if pool.error is None:
            pool.error = exc
        if whole_run or pool is self._own:
            if self.error is None:
                self.error = exc
            self.stop(reason)
        else:
            pool.cancel(reason)
        pool.wake()

    def stop_admission(self, reason: str) -> None:
        """Start no new rollout from now on, in any batch; rollouts in flight go on.

        Rows handed to `collect` but not yet started are never started (resume re-runs them);
        a row a worker already holds settles as `Omitted` (drained).
        """
        self.window.close(reason)
        for pool in list(self._pools):
            pool.stop_admission(reason)

    def cancel_in_flight(self, reason: str) -> None:
        """Cancel every rollout in flight now, in every batch; each settles as `Omitted`.

        Admission closes too. The driver's own code is not cancelled.
        """
        self.stop_admission(reason)
        for pool in list(self._pools):
            pool.cancel(reason)

    async def wind_down(self, reason: str, *, grace_s: float) -> None:
        """Stop admission, give rollouts in flight `grace_s` seconds, then cancel the rest.

        This is how a signal or ``--max-run-time`` ends a run: everything that finishes within
        the grace period is recorded as usual, the rest as omitted, and the folder stays
        resumable.

        Cancellation: a checkpoint; if cancelled, admission is closed and nothing else changed.
        """
        self.stop_admission(reason)
        with trio.move_on_after(grace_s):
            while any(pool.settled < pool.accepted for pool in self._pools):
                await self._changed.wait()
            return
        self.cancel_in_flight(f"{reason}; the grace period of {grace_s:g} s ended")

    # --- pools ------------------------------------------------------------------------------

    async def start_pool(self, pool: Pool) -> None:
        """Host a new pool's workers in the collector's nursery (`open_batch` calls this).

        Raises:
            RunStoppedError: the run was stopped; no new batch may start.

        Cancellation: a checkpoint; if cancelled, the pool never started.
        """
        if self._nursery is None or self.stop_reason is not None:
            raise RunStoppedError(self.stop_reason or "the collector is not open")
        self._pools.add(pool)
        try:
            await self._nursery.start(pool.serve)
        except BaseException:
            self._pools.discard(pool)
            raise

    def forget_pool(self, pool: Pool) -> None:
        """Drop a completed pool (its batch has closed)."""
        self._pools.discard(pool)

    def begin_dispatch(self) -> None:
        """Start the dispatch window and the run's clock, once (the first row or batch)."""
        if self.window.started_at is None:
            self.window.begin()
            self.timer.mark_dispatch_start()

    def _retained(self, pool: Pool, settled: list[tuple[Outcome, MaterializedRow | None]]) -> None:
        if self._retain:
            self._unconsumed.extend(outcome for outcome, _ in settled)

    # --- the writer -------------------------------------------------------------------------

    async def _writer(self) -> None:
        # Shielded: the writer outlives a cancellation until every worker has exited (they close
        # the channel), so each settled outcome, including the omitted ones, reaches its sink.
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

    async def _settle(self, batch: list[Settled]) -> None:
        by_pool: dict[Pool, list[tuple[Outcome, MaterializedRow | None]]] = {}
        observer = self.observer
        now = self.timer.now()  # the batch settles at one instant: no checkpoint in this loop
        for pool, outcome, row in batch:
            self.progress.record(outcome)
            if observer is not None:
                observer.outcome_settled(outcome, row is not None)
            self.timer.finished(outcome, now)
            if type(outcome) is not Omitted:
                self.window.finished(outcome.elapsed_seconds)
            reason = self._stops.check(outcome)
            if reason is not None and self.stop_reason is None:
                self.stop(reason)
            by_pool.setdefault(pool, []).append((outcome, row))
        for pool, settled in by_pool.items():
            await self._write(pool, [outcome for outcome, _ in settled])
            self.finals += sum(1 for _, row in settled if row is not None)
            pool.deliver(settled)
        self._changed.set()
        self._changed = trio.Event()

    async def _write(self, pool: Pool, outcomes: list[Outcome]) -> None:
        sink = pool.sink
        if sink is None or pool.sink_error is not None:
            return
        own = sink is self.sink
        if own and self.sink_error is not None:
            return
        try:
            await sink.write(outcomes)
        except Exception as exc:  # any sink's failure ends what it serves, never the writer
            pool.sink_error = exc
            if own:
                self.sink_error = exc
                self.fail(pool, exc, f"the outcomes could not be written: {exc}", whole_run=True)
            else:
                self.fail(pool, exc, f"the batch's outcomes could not be written: {exc}")

    def count_unrecorded(self) -> None:
        """Count (and log) accepted rows whose outcome the writer never handed to a sink.

        Only a writer stopped at its teardown deadline (a sink hung past the flush bound) leaves
        any; resume re-runs them, since nothing of theirs is on record.
        """
        self.unrecorded = self.progress.submitted - self.finals
        if self.unrecorded:
            _log.warning(
                "trollout: %d accepted rollouts never reached the sink: the writer was stopped "
                "after %g s of flushing while the sink still had not taken them; resume re-runs "
                "them",
                self.unrecorded,
                SHIELDED_FLUSH_S,
            )


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
    observer: Observer | None = None,
    enrich: Enrich | bool | None = True,
) -> AsyncIterator[Collector]:
    """Open a collection engine: worker pools and a writer inside one nursery.

    Args:
        config: run settings (concurrency, timeouts, retries); defaults when None.
        urls: ``{agent or environment server name: base URL}``; each rollout goes to
            ``urls[identity.environment_server or identity.agent_name] + "/run"``.
        resolve: instead of `urls`, a function from a rollout's `Identity` to its full URL.
        sink: where the writer hands settled outcomes (`recovery.store.RunStore` for a run
            folder); None keeps nothing unless `retain_outcomes`. A batch may have its own.
        transport: the `/run` transport; one is opened (and closed on exit) when None.
        retain_outcomes: keep settled outcomes of `submit`/`collect` for `next_outcome` /
            `drain_nowait` (batches always hand theirs to their consumer).
        seed: seeds the retry jitter (tests); None draws from the OS.
        policy_model_servers: ``{agent or environment server name: model server name}``;
            each outcome is stamped ``ng_policy_model_server`` from its agent, else its
            environment server (`Deployment.policy_model_servers`).
        observer: telemetry's hook (`observer.Observer`, `trollout.telemetry`); None: off.
        enrich: what each landed outcome goes through before it is written: True (default)
            the enrichment the settings ask for (`enricher_for`), False or None nothing, or
            an `Enrich` of the caller's.

    On a normal exit the block waits for every submitted rollout to settle. On an exception, or
    when the surrounding scope is cancelled, rollouts in flight are cancelled and settle as
    `Omitted`; the writer flushes every settled outcome to its sink before the block exits.

    Cancellation: entering is not a checkpoint that loses anything; see above for exit.
    """
    config = config or RunConfig()
    if resolve is None:
        if urls is None:
            raise TypeError("open_collector needs urls= or resolve=")
        resolve = url_resolver(urls)
    own_transport = transport is None
    if transport is None:
        transport = Http11Transport(
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
        observer=None if observer is None else Guarded(observer),
        enrich=enricher_for(config) if enrich is True else enrich or None,
    )
    try:
        async with _running(collector) as driver_error:
            yield collector
    finally:
        collector.count_unrecorded()  # the nursery has exited: every worker and the writer
        if own_transport:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await transport.aclose()
    if driver_error:
        raise driver_error[0]
    if collector.error is not None:
        raise collector.error
    if collector.stop_reason is not None:
        raise RunStoppedError(collector.stop_reason)


def enricher_for(config: RunConfig) -> Enricher:
    """Return the enrichment a run's settings ask for (`trollout.enrichment`).

    Observability off still projects an agent's own trajectory, as NeMo Gym's collector does.
    """
    return Enricher(
        EnrichmentOptions(
            observability=config.observability_enabled,
            capture_dir=config.model_call_capture_dir,
            include_payloads=config.include_model_call_payloads,
            delete_capture=config.delete_model_call_capture,
        )
    )


@asynccontextmanager
async def _running(collector: Collector) -> AsyncIterator[list[Exception]]:
    """Run the writer and the collector's own pool around the driver's block.

    Yields a list that holds the driver's exception, if it raised one: the block cancels the
    run, flushes, and leaves re-raising to the caller, so the driver sees its own error rather
    than the nurseries' exception groups.
    """
    driver_error: list[Exception] = []
    own = collector._own
    async with trio.open_nursery() as nursery:
        collector._nursery = nursery
        nursery.start_soon(collector._writer)
        try:
            await nursery.start(own.serve)
            try:
                yield driver_error
            except Exception as exc:
                driver_error.append(exc)
                collector.cancel_in_flight(f"the driver raised {exc!r}")
            else:
                own.close_rows()
        except BaseException:
            # A cancellation or a crash: cancel every pool, bound the writer's shielded flush.
            collector.cancel_in_flight("the collector's block was left early")
            collector._writer_scope.deadline = trio.current_time() + SHIELDED_FLUSH_S
            raise
        finally:
            if driver_error:
                collector._writer_scope.deadline = trio.current_time() + SHIELDED_FLUSH_S
            with trio.CancelScope(shield=True):
                await own.finished.wait()
                collector.out_tx.close()  # the workers hold clones: the writer ends after them
                await collector._writer_done.wait()
