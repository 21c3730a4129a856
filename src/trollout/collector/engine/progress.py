"""Live counters of a run: what the engine's writer has settled so far.

The writer task updates a `Progress` once per settled outcome; the progress display, the CLI's
summary and embedding drivers read it. It is plain data on the event loop's thread: no lock.
"""

from __future__ import annotations

import math
from collections import Counter

import attrs

from ...records import Failed, Landed, OmitReason, Outcome

__all__ = ["Progress"]


@attrs.define
class Progress:
    """Live counters of a run, updated by the writer (read them, never write them).

    Attributes:
        submitted: rollouts handed to the workers.
        landed: outcomes that landed.
        failed: written failures, by class.
        no_persist: kill-shaped replies (written nowhere).
        omitted: attempts interrupted in flight.
        drained: attempts that never started (the dispatch window closed first).
        reward_sum: sum of rewards over landed, scored rollouts.
        scored: landed rollouts that carried a reward.
        started_at: trio time the collector opened.
    """

    submitted: int = 0
    landed: int = 0
    failed: Counter[str] = attrs.field(factory=Counter)
    no_persist: int = 0
    omitted: int = 0
    drained: int = 0
    reward_sum: float = 0.0
    scored: int = 0
    started_at: float = 0.0

    @property
    def settled(self) -> int:
        """Outcomes the writer has handled."""
        return (
            self.landed + sum(self.failed.values()) + self.no_persist + self.omitted + self.drained
        )

    @property
    def mean_reward(self) -> float:
        """Mean reward over landed, scored rollouts (NaN before the first)."""
        return self.reward_sum / self.scored if self.scored else math.nan

    def record(self, outcome: Outcome) -> None:
        """Count one settled outcome."""
        if isinstance(outcome, Landed):
            self.landed += 1
            reward = outcome.reward
            if reward is not None:
                self.reward_sum += reward
                self.scored += 1
        elif isinstance(outcome, Failed):
            if outcome.no_persist:
                self.no_persist += 1
            else:
                self.failed[outcome.failure_class] += 1
        elif outcome.reason is OmitReason.DRAINED:
            self.drained += 1
        else:
            self.omitted += 1
