"""The engine's one telemetry hook: an optional observer of attempts and outcomes.

Design note. Telemetry (traces, metrics; `trollout.telemetry`) watches the engine through this
narrow protocol and nothing else. The collector holds ``observer: Observer | None``, None by
default, so with telemetry off the hot path pays one ``is None`` test per attempt and per
settled batch, and no telemetry module is imported at all. What the engine already counts (in
flight, resident rollouts, breaker states, retry counters) is not pushed through the hook: an
observer reads it from the `Collector` when its metrics are collected, at no cost per rollout.

Rejected alternative: telemetry calls (spans, counters) written into the engine, dispatch and
transport where each event happens. They would tie the collector to OpenTelemetry, make "off"
a set of flags checked all over the hot path, and scatter one concern over five modules.

Every hook runs on the event loop's thread and must return at once: it may not block, await
or raise (an observer swallows its own errors; telemetry never fails a rollout).
"""

from __future__ import annotations

from typing import Protocol

from ..records import Failed, Landed, MaterializedRow, Outcome

__all__ = ["AttemptTrace", "Observer"]


class AttemptTrace(Protocol):
    """What an observer keeps for one attempt in flight (a span, its start time).

    Attributes:
        headers: extra request header lines, each ending in CRLF (``traceparent: ...``), that
            every POST of the attempt carries; ``b""`` for none.
    """

    headers: bytes


class Observer(Protocol):
    """Watches one collector: attempts as they run, outcomes as the writer settles them."""

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

    def outcome_settled(self, outcome: Outcome, final: bool) -> None:
        """Note one outcome the writer settled (`final`: the rollout's last in this run)."""
        ...
