"""One dispatch session: the engine over the rows, and everything that watches it.

Beside the collector, in one nursery inside the collector's block: the observer's progress
display, the store's housekeeping, the ``--max-run-time`` deadline, the periodic timing summary,
the model-server queue sampler, and the caller's watchers (`Watcher`: the command line's signal
watcher, `signals.watch_signals`; a Ray block's stop from its driver). When the last row settles
the nursery is cancelled, which ends every watcher; when a watcher winds the run down, the
collector's own scope does the cancelling. Nothing outlives the block.

Ending early, by one mechanism (`Collector.wind_down`, through `Session.wind_down`): a watcher,
or the run's deadline, stops admission at once, gives rollouts in flight ``grace_s`` seconds,
then cancels the rest, which settle as omitted; the store flushes everything settled, so the
folder is resumable. `Session` records why (a signal, the deadline, a reason), which becomes
the `RunResult`'s ``signal``, ``deadline_reached`` and ``stopped``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING

import attrs
import trio

from ..collector.engine.collector import Collector, open_collector
from ..collector.http.transport import PostTransport
from ..records import Identity, MaterializedRow
from ..recovery.store import RunStore
from ..settings import RunConfig
from .deployment import http_client
from .observe import CollectorView, RunObserver

if TYPE_CHECKING:
    from ..telemetry.runtime import Telemetry

__all__ = ["Session", "StopWhen", "Watcher", "run_session", "stop_when_watcher", "timing_report"]

# Given the collector (to read its progress), returns why the run should wind down.
StopWhen = Callable[[Collector], Awaitable[str]]


@attrs.define
class Session:
    """A session as its watchers see it, and how it ended besides its counters.

    Attributes:
        collector: the engine (its progress, timer and retry counters).
        config: the run's settings (``grace_s``, ...).
        observer: where lines for people go.
        signal: the first signal a watcher reported (SIGINT or SIGTERM), or None.
        deadline_reached: ``--max-run-time`` ended admission.
        stopped: the reason a watcher gave for winding the run down, or None.
    """

    collector: Collector
    config: RunConfig
    observer: RunObserver
    signal: int | None = None
    deadline_reached: bool = False
    stopped: str | None = None

    @property
    def interrupted(self) -> bool:
        """Whether something other than the end of the rows ended the session."""
        return self.signal is not None or self.deadline_reached or self.stopped is not None

    def message(self, text: str) -> None:
        """Show a line for people (the observer's)."""
        self.observer.message(text)

    async def wind_down(self, reason: str) -> None:
        """Stop admission; rollouts in flight get ``grace_s``, then are cancelled."""
        await self.collector.wind_down(reason, grace_s=self.config.grace_s)


# A task run beside the engine for the whole session (cancelled when the rows settle).
Watcher = Callable[[Session], Awaitable[None]]


def stop_when_watcher(stop_when: StopWhen) -> Watcher:
    """Return the watcher that winds the run down when ``stop_when`` returns a reason."""

    async def watch(session: Session) -> None:
        reason = await stop_when(session.collector)
        session.stopped = reason
        await session.wind_down(reason)

    return watch


async def run_session(
    store: RunStore,
    config: RunConfig,
    resolve: Callable[[Identity], str],
    rows: Iterable[tuple[MaterializedRow, int]],
    *,
    total: int,
    observer: RunObserver,
    watchers: Sequence[Watcher] = (),
    transport: PostTransport | None = None,
    policy_model_servers: Mapping[str, str] | None = None,
    telemetry: Telemetry | None = None,
    job_attributes: Mapping[str, str | int] | None = None,
) -> Session:
    """Dispatch ``rows`` into ``store`` with the watchers beside the engine.

    With `telemetry` (`trollout.telemetry.runtime.open_telemetry`), the collector reports to it
    and its job span (with `job_attributes`) covers the session.

    Cancellation: cancelling interrupts rollouts in flight (settled as omitted) after every
    settled outcome reached the store.
    """
    async with (
        open_collector(
            config=config,
            resolve=resolve,
            sink=store,
            transport=transport,
            policy_model_servers=policy_model_servers,
            observer=telemetry,
        ) as collector,
        trio.open_nursery() as nursery,
    ):
        session = Session(collector, config, observer)
        collector.timer.expected = total
        if telemetry is not None:
            telemetry.watch(collector, expected=total, attributes=job_attributes or {})
        nursery.start_soon(observer.watch, CollectorView(collector, total))
        await nursery.start(store.run_housekeeping)
        _start_watchers(nursery, session)
        for watcher in watchers:
            nursery.start_soon(watcher, session)
        await collector.collect(rows)
        nursery.cancel_scope.cancel(reason="every row settled")
    return session


def _start_watchers(nursery: trio.Nursery, session: Session) -> None:
    collector, config = session.collector, session.config
    if config.max_run_time_s is not None:
        nursery.start_soon(_watch_deadline, session, config.max_run_time_s)
    if config.timing_summary_interval_s is not None:
        nursery.start_soon(
            partial(
                collector.timer.run_summaries,
                session.message,
                config.timing_summary_interval_s,
                retries=collector.retry_state.counters,
            )
        )
    if config.server_queue_metrics_urls:
        nursery.start_soon(_sample_queues, collector, config)


def timing_report(collector: Collector) -> str:
    """Render the run's timing report as of now."""
    return collector.timer.report(retries=collector.retry_state.counters).render()


async def _watch_deadline(session: Session, max_run_time_s: float) -> None:
    await trio.sleep(max_run_time_s)
    session.deadline_reached = True
    await session.collector.wind_down(
        f"--max-run-time of {max_run_time_s:g} s reached", grace_s=session.config.grace_s
    )


async def _sample_queues(collector: Collector, config: RunConfig) -> None:
    async with http_client(connect_timeout_s=2.0, read_timeout_s=10.0) as client:
        await collector.timer.run_queue_sampler(
            client, config.server_queue_metrics_urls, config.server_queue_sample_interval_s
        )
