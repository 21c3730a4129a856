"""How healthy a run's timing was: latency summary, stragglers, model-server queues.

`RunTimer` is fed by the engine (`started` when a rollout is sent, `finished` when its outcome
settles) and by `RunTimer.run_queue_sampler`, which reads vLLM's Prometheus gauges
``vllm:num_requests_waiting`` and ``vllm:num_requests_running`` from every
``server_queue_metrics_urls`` entry and sums them over servers. `RunTimer.report` compares the
run with the healthy bounds of docs/protocol.md section 9 and returns a `RunTimingReport`, whose
`render` is what the CLI prints at the end, every ``timing_summary_interval_s`` and on SIGTERM.
The report is diagnostic: nothing here ever stops a run. The report's records live in
`timing_report` and the sampling in `queues`; both are re-exported here.

Design note: memory stays small and flat. Start-time rows need only counters (how many started
within the window, when the last one started); durations of finished rollouts are kept in one
``array('d')`` (8 bytes each) because percentiles and the straggler threshold need them all;
only rollouts in flight are kept by identity. Rejected alternative: a streaming quantile sketch
(t-digest, P²): constant memory, but approximate p90s make the straggler threshold and the tests
fuzzy, and 8 bytes per rollout is small next to the rollouts themselves.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Sequence
from typing import Final

import attrs
import httpx
import trio
from attrs import frozen

from ...records import Failed, Identity, Landed, OmitReason, Omitted, Outcome
from ...settings import DEFAULT_START_MIN_FRACTION, RunConfig
from ..dispatch.retry import RetryCounters
from .queues import QueueSample, parse_vllm_queue, sample_queues
from .timing_report import LatencySummary, RunTimingReport, Straggler, TimingRow, format_seconds

__all__ = [
    "LatencySummary",
    "QueueSample",
    "RunTimer",
    "RunTimingReport",
    "Straggler",
    "TimingBounds",
    "TimingRow",
    "parse_vllm_queue",
    "percentile",
    "sample_queues",
]

MIN_FINISHED_FOR_STRAGGLERS: Final = 5  # no p90 worth comparing against before this
_PRODUCER_TIMEOUT: Final = "timeout_exceeded"  # a producer's own limit (docs/protocol.md 2)


def percentile(ordered: Sequence[float], q: float) -> float:
    """Return the `q` quantile (0..1) of ascending `ordered`, linearly interpolated (NaN: empty)."""
    if not ordered:
        return math.nan
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@frozen(kw_only=True)
class TimingBounds:
    """The healthy bounds a run is compared with (docs/protocol.md section 9)."""

    rollout_timeout_s: float | None = None
    dispatch_start_report_within_s: float | None = None
    dispatch_start_report_min_fraction: float = DEFAULT_START_MIN_FRACTION
    dispatch_all_started_within_s: float | None = None
    timed_out_max_fraction: float = 0.01
    long_rollout_s: float | None = None
    long_rollout_max_fraction: float = 0.05
    server_queue_max_waiting_ratio: float = 1.0
    straggler_p90_multiple: float = 3.0

    @classmethod
    def from_config(cls, config: RunConfig) -> TimingBounds:
        """Take the bounds of a run's settings."""
        names = [a.name for a in attrs.fields(cls)]
        return cls(**{name: getattr(config, name) for name in names})


class RunTimer:
    """Collects the timing of a run: starts, ends, queue samples; builds reports.

    Args:
        bounds: the healthy bounds to compare with.
        expected: rollouts the run was asked for (None: unknown; fractions use those started).
        clock: the time source (trio's clock by default, so the fake clock drives tests).
    """

    def __init__(
        self,
        bounds: TimingBounds | None = None,
        *,
        expected: int | None = None,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.bounds = bounds or TimingBounds()
        self.expected = expected
        self._clock = clock
        self.dispatch_start: float | None = None
        self.started_count = 0
        self.started_in_window = 0
        self.last_start: float | None = None
        # Keyed by run id too: two batches of one collector may both have a task 0 in flight.
        self._running: dict[tuple[str | None, int, int], tuple[Identity, float]] = {}
        self._durations = array("d")
        self._landed_s = 0.0
        self.timed_out = 0
        self.drained = 0
        self.interrupted = 0
        self.samples: list[QueueSample] = []

    @classmethod
    def from_config(cls, config: RunConfig, *, expected: int | None = None) -> RunTimer:
        """Return a timer with the bounds of `config`."""
        return cls(TimingBounds.from_config(config), expected=expected)

    # --- feeding ------------------------------------------------------------------------------

    def mark_dispatch_start(self) -> None:
        """Mark the start of dispatch (the first `started` marks it when this is not called)."""
        if self.dispatch_start is None:
            self.dispatch_start = self._clock()

    def now(self) -> float:
        """Read the timer's clock (a caller recording many outcomes at once reads it once)."""
        return self._clock()

    def started(self, identity: Identity, now: float | None = None) -> None:
        """Record that a rollout was sent at ``now`` (None: read the clock)."""
        if now is None:
            now = self._clock()
        self.mark_dispatch_start()
        assert self.dispatch_start is not None
        self.started_count += 1
        within = self.bounds.dispatch_start_report_within_s
        if within is not None and now - self.dispatch_start <= within:
            self.started_in_window += 1
        self.last_start = now
        self._running[(identity.run_id, *identity.key)] = (identity, now)

    def finished(self, outcome: Outcome, now: float | None = None) -> None:
        """Record a rollout's settled outcome at ``now`` (None: read the clock).

        Drained ones need no `started`.
        """
        ident = outcome.identity
        begun = self._running.pop((ident.run_id, *ident.key), None)
        if type(outcome) is Omitted:
            if outcome.reason is OmitReason.DRAINED:
                self.drained += 1
            else:
                self.interrupted += 1
            return
        if begun:
            duration: float | None = (self._clock() if now is None else now) - begun[1]
        else:
            duration = outcome.elapsed_seconds
        if duration is None:
            return
        self._durations.append(duration)
        if type(outcome) is Landed:
            self._landed_s += duration
        elif type(outcome) is Failed and _ended_by_limit(outcome):
            self.timed_out += 1

    def add_queue_sample(self, sample: QueueSample) -> None:
        """Keep one round of queue gauges."""
        self.samples.append(sample)

    # --- reading ------------------------------------------------------------------------------

    @property
    def running(self) -> int:
        """Rollouts in flight now."""
        return len(self._running)

    def latency(self) -> LatencySummary:
        """Return the latency summary of the finished rollouts."""
        ordered = sorted(self._durations)
        return self._latency(ordered)

    def stragglers(self) -> list[Straggler]:
        """Return rollouts running longer than `straggler_p90_multiple` x the finished p90."""
        return self._stragglers(sorted(self._durations))[1]

    def report(self, *, retries: RetryCounters | None = None) -> RunTimingReport:
        """Return the timing report as of now.

        Args:
            retries: the run's retry counters, shown in the report when given.
        """
        ordered = sorted(self._durations)
        threshold, stragglers = self._stragglers(ordered)
        start = self.dispatch_start
        return RunTimingReport(
            elapsed_s=0.0 if start is None else self._clock() - start,
            expected=self.expected,
            started=self.started_count,
            running=self.running,
            rows=(
                self._start_row(),
                self._all_started_row(),
                self._timed_out_row(),
                self._long_row(ordered),
                self._queue_row(),
            ),
            latency=self._latency(ordered),
            straggler_threshold_s=threshold,
            stragglers=tuple(stragglers),
            retries=retries,
        )

    # --- tasks --------------------------------------------------------------------------------

    async def run_queue_sampler(
        self,
        client: httpx.AsyncClient,
        urls: Sequence[str],
        interval_s: float,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Sample the model servers' queues every `interval_s` until cancelled.

        Args:
            client: the HTTP client (shared by the run).
            urls: the ``/metrics`` URLs (``server_queue_metrics_urls``).
            interval_s: seconds between rounds; also bounds each round.
            task_status: reports started once the sampler runs.

        Cancellation: this is how it stops; a round in progress is abandoned (its connections
        closed) and nothing else is left behind.
        """
        task_status.started()
        while True:
            with trio.move_on_after(interval_s):
                self.add_queue_sample(await sample_queues(client, urls))
            await trio.sleep(interval_s)

    async def run_summaries(
        self,
        emit: Callable[[str], None],
        interval_s: float,
        *,
        retries: RetryCounters | None = None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Emit the rendered report every `interval_s` until cancelled.

        Cancellation: this is how it stops; it only calls `emit`.
        """
        task_status.started()
        while True:
            await trio.sleep(interval_s)
            emit(self.report(retries=retries).render())

    # --- rows ---------------------------------------------------------------------------------

    def _latency(self, ordered: Sequence[float]) -> LatencySummary:
        return LatencySummary(
            finished=len(ordered),
            median_s=percentile(ordered, 0.5),
            p90_s=percentile(ordered, 0.9),
            p99_s=percentile(ordered, 0.99),
            max_s=ordered[-1] if ordered else math.nan,
            task_hours=self._landed_s / 3600.0,
            drained=self.drained,
        )

    def _stragglers(self, ordered: Sequence[float]) -> tuple[float, list[Straggler]]:
        if len(ordered) < MIN_FINISHED_FOR_STRAGGLERS:
            return math.nan, []
        p90 = percentile(ordered, 0.9)
        threshold = self.bounds.straggler_p90_multiple * p90
        now = self._clock()
        found = [
            Straggler(identity, now - begun, (now - begun) / p90 if p90 > 0 else math.inf)
            for identity, begun in self._running.values()
            if now - begun > threshold
        ]
        return threshold, sorted(found, key=lambda s: -s.running_s)

    def _denominator(self) -> int:
        return self.expected if self.expected is not None else self.started_count

    def _start_row(self) -> TimingRow:
        within = self.bounds.dispatch_start_report_within_s
        if within is None:
            return TimingRow("started within a window", "no window set (start_report_within_s)")
        check = f"started within {format_seconds(within)} of dispatch"
        total = self._denominator()
        if not total:
            return TimingRow(check, "no rollouts")
        fraction = self.started_in_window / total
        value = f"{_pct(fraction)} ({self.started_in_window} of {total})"
        least = self.bounds.dispatch_start_report_min_fraction
        return TimingRow(check, value, f">= {_pct(least)}", fraction >= least)

    def _all_started_row(self) -> TimingRow:
        bound_s = self.bounds.dispatch_all_started_within_s
        bound = f"<= {format_seconds(bound_s)}" if bound_s is not None else ""
        check = "all started"
        start = self.dispatch_start
        if start is None or self.last_start is None:
            return TimingRow(check, "none started yet", bound)
        total = self._denominator()
        if self.started_count >= total:
            took = self.last_start - start
            ok = None if bound_s is None else took <= bound_s
            return TimingRow(check, f"after {format_seconds(took)}", bound, ok)
        value = f"{total - self.started_count} not started yet"
        late = bound_s is not None and self._clock() - start > bound_s
        return TimingRow(check, value, bound, False if late else None)

    def _timed_out_row(self) -> TimingRow:
        limit = self.bounds.rollout_timeout_s
        check = "ended by the rollout limit" + (
            f" ({format_seconds(limit)})" if limit is not None else ""
        )
        if limit is None and not self.timed_out:  # a producer's own limit shows when it hits
            return TimingRow(check, "no limit set (rollout_timeout_s)")
        finished = len(self._durations)
        most = self.bounds.timed_out_max_fraction
        if not finished:
            return TimingRow(check, "none finished yet", f"<= {_pct(most)}")
        fraction = self.timed_out / finished
        value = f"{_pct(fraction)} ({self.timed_out} of {finished})"
        return TimingRow(check, value, f"<= {_pct(most)}", fraction <= most)

    def _long_row(self, ordered: Sequence[float]) -> TimingRow:
        long_s = self.bounds.long_rollout_s
        if long_s is None:
            return TimingRow("longer than long_rollout_s", "no bound set (long_rollout_s)")
        check = f"longer than {format_seconds(long_s)}"
        most = self.bounds.long_rollout_max_fraction
        if not ordered:
            return TimingRow(check, "none finished yet", f"<= {_pct(most)}")
        count = sum(1 for d in ordered if d > long_s)
        fraction = count / len(ordered)
        value = f"{_pct(fraction)} ({count} of {len(ordered)})"
        return TimingRow(check, value, f"<= {_pct(most)}", fraction <= most)

    def _queue_row(self) -> TimingRow:
        check = "model-server queue waiting/running"
        ratio = self.bounds.server_queue_max_waiting_ratio
        answered = [s for s in self.samples if s.servers]
        if not answered:
            errors = sum(s.errors for s in self.samples)
            value = "not sampled" if not errors else f"no answer ({errors} failed reads)"
            problem = next((s.problem for s in reversed(self.samples) if s.problem), None)
            if problem is not None:
                value += f"; last: {problem}"
            return TimingRow(check, value)
        waiting = sum(s.waiting for s in answered) / len(answered)
        running = sum(s.running for s in answered) / len(answered)
        peak = max(s.waiting for s in answered)
        measured = waiting / running if running else (math.inf if waiting else 0.0)
        value = (
            f"{measured:.2f} (mean waiting {waiting:.1f}, peak {peak:g}; mean running "
            f"{running:.1f}; {len(answered)} samples)"
        )
        return TimingRow(check, value, f"<= {ratio:g}", measured <= ratio)


def _ended_by_limit(outcome: Failed) -> bool:
    """Whether a failure was ended by a per-rollout time limit.

    Ours (kind ``timeout``) or a producer's own (class ``timeout_exceeded``, also as the
    producer's original class), as NeMo Gym's ``RunTimingReport.record_result`` counts them.
    """
    return (
        outcome.kind == "timeout"
        or outcome.failure_class == _PRODUCER_TIMEOUT
        or outcome.extra.get("_ng_failure_legacy_class") == _PRODUCER_TIMEOUT
    )


def _pct(fraction: float) -> str:
    return f"{100.0 * fraction:.1f}%"
