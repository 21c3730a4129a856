"""The attempt hooks dispatch calls: the part of the engine's observer one rollout sees.

Design note. `request.dispatch` tells an observer when each attempt starts, waits before a
re-send, and ends; the engine's `engine.observer.Observer` is this protocol plus the writer's
own hook (`outcome_settled`). The protocol lives here, below the engine, because dispatch is
what calls it: dispatch importing the engine's observer module was an edge from a lower stage
into a higher one. The engine wraps whatever observer it is given (`engine.observer.Guarded`)
before dispatch sees it, so a hook that raises never reaches this layer.

Rejected alternative: the whole observer (with `Guarded`) moved here. The guard and the
settled-outcome hook belong to the writer, which dispatch never sees.
"""

from __future__ import annotations

from typing import Protocol

from ...records import Failed, Landed, MaterializedRow

__all__ = ["AttemptObserver", "AttemptTrace"]


class AttemptTrace(Protocol):
    """What an observer keeps for one attempt in flight (a span, its start time).

    Attributes:
        headers: extra request header lines, each ending in CRLF (``traceparent: ...``), that
            every POST of the attempt carries; ``b""`` for none.
    """

    headers: bytes


class AttemptObserver(Protocol):
    """Watches the attempts of rollouts as dispatch runs them."""

    def attempt_started(self, row: MaterializedRow, attempt: int, url: str) -> AttemptTrace:
        """Note that `attempt` of `row` starts its first POST to `url` (a limiter slot held)."""
        ...

    def retry_wait(self, trace: AttemptTrace, reason: str, delay_s: float) -> None:
        """Note that the attempt waits `delay_s` before a re-send (`reason`: ``connect``, ...)."""
        ...

    def attempt_ended(
        self, trace: AttemptTrace, outcome: Landed | Failed | None, retries: int
    ) -> None:
        """Note the attempt's end: its outcome, or None when it was cancelled in flight."""
        ...
