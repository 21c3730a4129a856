"""One dispatch session: the engine over the rows, and everything that watches it.

Beside the collector, in one nursery inside the collector's block: the progress display, the
store's housekeeping, the signal watcher, the ``--max-run-time`` deadline, the periodic timing
summary and the model-server queue sampler. When the last row settles the nursery is cancelled,
which ends every watcher; when a watcher winds the run down, the collector's own scope does the
cancelling. Nothing outlives the block.

Ending early, by one mechanism (`Collector.wind_down`): the first SIGINT or SIGTERM, or the run's
deadline, stops admission at once, gives rollouts in flight ``grace_s`` seconds, then cancels the
rest, which settle as omitted; the store flushes everything settled, so the folder is resumable.
A second SIGINT cancels at once. On SIGTERM the timing report is printed before winding down
(a job scheduler's kill may follow soon). Signals are only watched on the main thread (Trio's
rule); an embedding driver that calls `collect_run` elsewhere handles its own. A driver may
also pass ``stop_when``, an async function given the collector that returns a reason when the
run should wind down the same way (a distributed run's coordinator asking its workers to stop).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from functools import partial
from typing import IO, TYPE_CHECKING

import attrs
import trio

from ..collector.engine.collector import Collector, open_collector
from ..collector.http.transport import PostTransport
from ..records import Identity, MaterializedRow
from ..recovery.store import RunStore
from ..settings import RunConfig
from .common import http_client
from .progress import ProgressReporter

if TYPE_CHECKING:
    from ..telemetry.runtime import Telemetry

__all__ = ["SessionEnd", "StopWhen", "run_session"]

# Given the collector (to read its progress), returns why the run should wind down.
StopWhen = Callable[[Collector], Awaitable[str]]


@attrs.define
class SessionEnd:
    """How a session ended, besides its counters.

    Attributes:
        collector: the engine (its progress, timer and retry counters).
        signal: the first signal received (SIGINT or SIGTERM), or None.
        deadline_reached: ``--max-run-time`` ended admission.
        stopped: the reason ``stop_when`` gave for winding the run down, or None.
    """

    collector: Collector
    signal: int | None = None
    deadline_reached: bool = False
    stopped: str | None = None

    @property
    def interrupted(self) -> bool:
        """Whether something other than the end of the rows ended the session."""
        return self.signal is not None or self.deadline_reached or self.stopped is not None


async def run_session(
    store: RunStore,
    config: RunConfig,
    resolve: Callable[[Identity], str],
    rows: Iterable[tuple[MaterializedRow, int]],
    *,
    total: int,
    stream: IO[str],
    live: bool | None,
    transport: PostTransport | None = None,
    policy_model_servers: Mapping[str, str] | None = None,
    stop_when: StopWhen | None = None,
    telemetry: Telemetry | None = None,
    job_attributes: Mapping[str, str | int] | None = None,
) -> SessionEnd:
    """Dispatch ``rows`` into ``store`` with the watchers beside the engine.

    With `telemetry` (`trollout.telemetry.runtime.open_telemetry`), the collector reports to it
    and its job span (with `job_attributes`) covers the session.

    Cancellation: cancelling interrupts rollouts in flight (settled as omitted) after every
    settled outcome reached the store.
    """
    reporter = ProgressReporter(total=total, stream=stream, live=live)
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
        end = SessionEnd(collector)
        collector.timer.expected = total
        if telemetry is not None:
            telemetry.watch(collector, expected=total, attributes=job_attributes or {})
        nursery.start_soon(reporter.run, collector)
        await nursery.start(store.run_housekeeping)
        _start_watchers(nursery, end, config, stream)
        if stop_when is not None:
            nursery.start_soon(_watch_stop, end, stop_when, config.grace_s)
        await collector.collect(rows)
        nursery.cancel_scope.cancel(reason="every row settled")
    return end


def _start_watchers(
    nursery: trio.Nursery, end: SessionEnd, config: RunConfig, stream: IO[str]
) -> None:
    collector = end.collector
    emit = partial(_emit, stream)
    if threading.current_thread() is threading.main_thread():
        nursery.start_soon(_watch_signals, end, config.grace_s, emit)
    if config.max_run_time_s is not None:
        nursery.start_soon(_watch_deadline, end, config.max_run_time_s, config.grace_s)
    if config.timing_summary_interval_s is not None:
        nursery.start_soon(
            partial(
                collector.timer.run_summaries,
                emit,
                config.timing_summary_interval_s,
                retries=collector.retry_state.counters,
            )
        )
    if config.server_queue_metrics_urls:
        nursery.start_soon(_sample_queues, collector, config)


def _emit(stream: IO[str], text: str) -> None:
    print(text, file=stream, flush=True)


def timing_report(collector: Collector) -> str:
    """Render the run's timing report as of now."""
    return collector.timer.report(retries=collector.retry_state.counters).render()


async def _watch_signals(end: SessionEnd, grace_s: float, emit: Callable[[str], None]) -> None:
    collector = end.collector
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            async for signum in signals:
                name = signal.Signals(signum).name
                if end.signal is None:
                    end.signal = signum
                    emit(
                        f"trollout: {name}: starting no new rollout; {grace_s:g} s for the rest "
                        "to finish (SIGINT again to stop at once)"
                    )
                    if signum == signal.SIGTERM:
                        emit(timing_report(collector))
                    nursery.start_soon(
                        partial(collector.wind_down, f"received {name}", grace_s=grace_s)
                    )
                elif signum == signal.SIGINT:
                    emit("trollout: second SIGINT: cancelling the rollouts in flight")
                    collector.cancel_in_flight("received a second SIGINT")


async def _watch_deadline(end: SessionEnd, max_run_time_s: float, grace_s: float) -> None:
    await trio.sleep(max_run_time_s)
    end.deadline_reached = True
    await end.collector.wind_down(
        f"--max-run-time of {max_run_time_s:g} s reached", grace_s=grace_s
    )


async def _watch_stop(end: SessionEnd, stop_when: StopWhen, grace_s: float) -> None:
    reason = await stop_when(end.collector)
    end.stopped = reason
    await end.collector.wind_down(reason, grace_s=grace_s)


async def _sample_queues(collector: Collector, config: RunConfig) -> None:
    async with http_client(connect_timeout_s=2.0, read_timeout_s=10.0) as client:
        await collector.timer.run_queue_sampler(
            client, config.server_queue_metrics_urls, config.server_queue_sample_interval_s
        )
