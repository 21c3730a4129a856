"""What the engine writes outcomes to: the `OutcomeSink` protocol.

The collector never imports recovery (docs/architecture.md): the engine's single writer task
hands each batch of settled outcomes to a sink it was given. `recovery.store.RunStore` is the
sink the CLI uses; an embedding driver may pass its own (a list, a channel, a database).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ...records import Identity, Outcome

__all__ = ["AttemptReserver", "ListSink", "OutcomeSink", "ResendRecorder"]


class OutcomeSink(Protocol):
    """Receives settled outcomes, in settlement order, from the engine's single writer task."""

    async def write(self, outcomes: Sequence[Outcome]) -> None:
        """Record a batch of outcomes durably (per the sink's own policy).

        Cancellation: the engine calls this inside a shielded scope, so an implementation is
        never cancelled halfway through a batch by the run's cancellation.
        """
        ...


@runtime_checkable
class AttemptReserver(Protocol):
    """A sink that also reserves attempt numbers before they are sent (optional).

    When the engine's sink has ``reserve``, a worker awaits it for each attempt it is about
    to send (holding its limiter token, admission still open) and for each re-send as a new
    attempt, so an attempt number is on record before its request can leave, and nothing is
    on record for a row that was never sent; `recovery.store.RunStore` writes it to the
    attempt ledger. It runs once per rollout: keep it cheap (a write, no fsync per call).
    """

    async def reserve(self, attempts: Sequence[tuple[Identity, int]]) -> None:
        """Record ``(rollout, attempt number)`` pairs durably before they are sent.

        Cancellation: may be a checkpoint; if it raises or is cancelled, none of them is sent
        (their numbers may still be on record, which is safe: a number is skipped, not reused).
        """
        ...


@runtime_checkable
class ResendRecorder(Protocol):
    """A sink that also records re-sends within an attempt (optional).

    When the engine's sink has ``resent``, `dispatch` calls it just before each re-send within
    an attempt leaves (a 429 or 503 retried, a connection re-tried), with the number the
    request carries in ``X-Trollout-Retry``; `recovery.store.RunStore` writes it to the attempt
    ledger. Re-sends are rare: one write each is fine.
    """

    def resent(self, identity: Identity, attempt: int, retry: int) -> None:
        """Record that re-send `retry` (1, 2, ...) of `attempt` of `identity` is leaving."""
        ...


class ListSink:
    """A sink that keeps outcomes in memory (tests and small embedding drivers)."""

    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []

    async def write(self, outcomes: Sequence[Outcome]) -> None:
        """Append the batch to `outcomes`."""
        self.outcomes.extend(outcomes)
