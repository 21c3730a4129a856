"""When new rollouts may start: the dispatch budget and the drain margin.

docs/protocol.md section 9: new rollouts may start only during ``dispatch_budget_s`` seconds from
the start of dispatch (0 means the budget is already spent). The check is made after a worker took a
concurrency slot, just before sending, so a rollout that waited for a slot past the deadline is
drained rather than started late. ``drain_margin_s`` stops starting sooner, when less than the
margin remains; by default, once 5 rollouts have finished, the margin is the p75 of their
durations, so the last rollouts started can still finish inside the budget.

The same window also closes on demand (`close`): a signal, ``--max-run-time`` or a run-level stop
ends admission through it, so "stop starting new rollouts" is one mechanism whatever the cause.

A batch has a budget of its own (`for_batch`). A training loop keeps one collector for hours
and opens a batch per step; NeMo Gym's ``run_examples`` "stops starting rows that many seconds
after this call", so the budget of a batch counts from the batch's opening, and spending it
closes that batch's admission only (its pool's), never the run's. The batch's window shares the
run's drain margin (``drain_margin_s``, or the p75 of the durations every pool's finished
rollouts recorded in the run's window), so a step's margin is known from its first rollout.
Rejected: one window for the collector, begun at its first batch (what this replaced: once the
budget had passed, every later batch yielded nothing and raised nothing), and resetting the
run's window at each batch (two batches open at once would share one clock, and a run-level
close would be undone by the next batch).

Design note: the durations kept for the p75 are the most recent `_KEPT` ones (a deque), so the
margin follows the run's current behaviour and memory stays bounded; an exact p75 over every
rollout of a million-rollout run would cost O(rollouts) memory for no practical gain. The p75 is
recomputed every `_RESORT_EVERY` finished rollouts, not before every start: sorting 4,096
durations per rollout would put ~0.3 ms on the dispatch path.
"""

from __future__ import annotations

import math
from collections import deque

import trio

from .timing import percentile

__all__ = ["DispatchWindow"]

_MIN_FINISHED = 5  # rollouts finished before the p75 margin applies
_KEPT = 4096  # recent durations kept for the p75
_RESORT_EVERY = 32  # finished rollouts between two computations of the p75


class DispatchWindow:
    """Decides whether a rollout may start now.

    Args:
        budget_s: seconds from `begin` during which rollouts may start; None: no budget.
        margin_s: stop this many seconds before the budget ends; None: the p75 of finished
            rollouts' durations once 5 have finished (0 before).
    """

    def __init__(
        self,
        *,
        budget_s: float | None,
        margin_s: float | None,
        run: DispatchWindow | None = None,
    ) -> None:
        self.budget_s = budget_s
        self.margin_s = margin_s
        self._run = run  # a batch's window takes the run's p75 (module docstring)
        self.started_at: float | None = None
        self.closed_reason: str | None = None
        self._durations: deque[float] = deque(maxlen=_KEPT)
        self._finished = 0
        self._p75 = 0.0
        self._p75_at: int | None = None  # `_finished` when `_p75` was computed

    def for_batch(self) -> DispatchWindow:
        """Return a window for one batch: this one's budget and margin, counted from its own
        `begin`, closed on its own (module docstring)."""
        return DispatchWindow(budget_s=self.budget_s, margin_s=self.margin_s, run=self)

    def begin(self) -> None:
        """Mark the start of dispatch (the budget counts from here); idempotent."""
        if self.started_at is None:
            self.started_at = trio.current_time()

    @property
    def deadline(self) -> float:
        """Trio time after which nothing may start (inf without a budget)."""
        if self.budget_s is None or self.started_at is None:
            return math.inf
        return self.started_at + self.budget_s

    def margin(self) -> float:
        """Seconds before the deadline at which admission stops."""
        if self.margin_s is not None:
            return self.margin_s
        if self._run is not None:
            return self._run.margin()
        if self._finished < _MIN_FINISHED:
            return 0.0
        # Called before every start: re-sort only after a few more rollouts finished.
        if self._p75_at is None or self._finished - self._p75_at >= _RESORT_EVERY:
            self._p75 = percentile(sorted(self._durations), 0.75)
            self._p75_at = self._finished
        return self._p75

    def finished(self, elapsed_s: float | None) -> None:
        """Record the duration of a rollout that ran (landed or failed)."""
        if elapsed_s is not None:
            self._durations.append(elapsed_s)
            self._finished += 1

    def admits(self) -> bool:
        """Whether a rollout may start now; closes the window when the budget is spent."""
        if self.closed_reason is not None:
            return False
        if self.budget_s is None:
            return True
        self.begin()
        if trio.current_time() < self.deadline - self.margin():
            return True
        self.close(self.spent_reason)
        return False

    @property
    def spent_reason(self) -> str:
        """The reason given when the budget runs out."""
        return f"dispatch budget of {self.budget_s:g} s spent"

    def close(self, reason: str) -> None:
        """Stop admission for good (the first reason is kept)."""
        if self.closed_reason is None:
            self.closed_reason = reason
