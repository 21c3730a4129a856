"""The run timing report's records: rows against healthy bounds, latency, stragglers.

Built by `timing.RunTimer.report`; `RunTimingReport.render` is the text the CLI prints.
"""

from __future__ import annotations

import math
from typing import Final

import attrs
from attrs import frozen

from ...records import Identity
from ...text import visible
from ..dispatch.retry import RetryCounters

__all__ = ["LatencySummary", "RunTimingReport", "Straggler", "TimingRow", "format_seconds"]

_LISTED_STRAGGLERS: Final = 10


@frozen
class LatencySummary:
    """Per-rollout latency of the finished rollouts (landed and failed executions).

    Attributes:
        finished: executions that ended with an outcome.
        median_s, p90_s, p99_s, max_s: their durations (NaN when none finished).
        task_hours: hours of rollout time that landed.
        drained: rollouts never started because the dispatch budget ran out.
    """

    finished: int
    median_s: float
    p90_s: float
    p99_s: float
    max_s: float
    task_hours: float
    drained: int

    def render(self) -> str:
        """Return the summary as one line."""
        quantiles = [("median", self.median_s), ("p90", self.p90_s), ("p99", self.p99_s)]
        shown = [f"{name} {format_seconds(value)}" for name, value in quantiles]
        shown.append(f"max {format_seconds(self.max_s)}")
        return (
            f"latency over {self.finished} finished: {' | '.join(shown)} | "
            f"task-hours {self.task_hours:.2f} | drained {self.drained}"
        )


@frozen
class Straggler:
    """A rollout running much longer than the p90 of finished ones."""

    identity: Identity
    running_s: float
    p90_multiple: float

    def render(self) -> str:
        """Return one line naming the rollout."""
        who = f"task {self.identity.task_index} rollout {self.identity.rollout_index}"
        name = self.identity.agent_name
        agent = f" ({visible(name)})" if name else ""  # a name from the input file
        running = format_seconds(self.running_s)
        return f"{who}{agent}: running {running} ({self.p90_multiple:.1f} x p90)"


@frozen
class TimingRow:
    """One line of the report: a measured value against its healthy bound.

    Attributes:
        check: what is measured.
        value: the measured value, formatted.
        bound: the healthy bound, formatted ("" when no bound is set).
        ok: True healthy, False outside the bound, None no verdict (no bound or no data yet).
    """

    check: str
    value: str
    bound: str = ""
    ok: bool | None = None

    def render(self, width: int) -> str:
        """Return the row as one aligned line."""
        mark = {True: "ok", False: "WARN", None: "-"}[self.ok]
        bound = f"  (healthy: {self.bound})" if self.bound else ""
        return f"  {mark:<4}  {self.check:<{width}}  {self.value}{bound}"


@frozen
class RunTimingReport:
    """The timing report of a run at one moment.

    Attributes:
        elapsed_s: seconds since dispatch started.
        expected: rollouts the run was asked for (None: unknown).
        started: rollouts sent so far.
        running: rollouts in flight now.
        rows: the checks against healthy bounds.
        latency: the latency summary.
        straggler_threshold_s: the straggler threshold in force (NaN: too few finished).
        stragglers: rollouts past the threshold, longest first.
        retries: the retry machinery's counters, when the run has them.
    """

    elapsed_s: float
    expected: int | None
    started: int
    running: int
    rows: tuple[TimingRow, ...]
    latency: LatencySummary
    straggler_threshold_s: float
    stragglers: tuple[Straggler, ...] = ()
    retries: RetryCounters | None = attrs.field(default=None, eq=False)

    @property
    def warnings(self) -> list[TimingRow]:
        """Return the rows outside their healthy bound."""
        return [row for row in self.rows if row.ok is False]

    def render(self) -> str:
        """Return the report as text, one line per row."""
        of = f" of {self.expected}" if self.expected is not None else ""
        lines = [
            f"run timing report: {format_seconds(self.elapsed_s)} since dispatch began, "
            f"{self.started}{of} started, {self.running} running"
        ]
        width = max((len(row.check) for row in self.rows), default=0)
        lines += [row.render(width) for row in self.rows]
        lines.append("  " + self.latency.render())
        lines += self._straggler_lines()
        if self.retries is not None and self.retries.summary():
            lines.append("  " + self.retries.summary())
        return "\n".join(lines)

    def _straggler_lines(self) -> list[str]:
        if not self.stragglers:
            return []
        threshold = format_seconds(self.straggler_threshold_s)
        head = f"  stragglers (running > {threshold}): {len(self.stragglers)}"
        listed = [f"    {s.render()}" for s in self.stragglers[:_LISTED_STRAGGLERS]]
        more = len(self.stragglers) - _LISTED_STRAGGLERS
        return [head, *listed, *([f"    ... and {more} more"] if more > 0 else [])]


def format_seconds(seconds: float | None) -> str:
    """Format seconds as ``4.2s``, or minutes from ten minutes on (``-`` for none)."""
    if seconds is None or math.isnan(seconds):
        return "-"
    return f"{seconds:.1f}s" if seconds < 600 else f"{seconds / 60:.1f}m"
