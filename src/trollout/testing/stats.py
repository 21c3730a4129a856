"""What the fake deployment observed, for tests to assert on.

Counters are always kept (O(1) per request). The detailed log of every ``/run`` (`RunSeen`) is
kept only when ``record_runs`` is on; benchmarks that send 100k+ requests turn it off.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from attrs import define, field, frozen

__all__ = ["FakeStats", "RunSeen"]


@frozen
class RunSeen:
    """One ``/run`` the fake received."""

    server: str  # instance name of the server that received it
    agent: str | None  # the agent it serves (an episode server may bind none)
    task_index: int
    rollout_index: int
    attempt_index: int
    fault: str | None  # the fault kind applied, or None
    traceparent: str | None = None  # the request's W3C ``traceparent`` header, if it had one
    run_id: str | None = None  # the batch that sent it: the request's ``_ng_run_id``, if any

    def to_json(self) -> dict[str, Any]:
        """Return the entry as a JSON-able mapping (``GET /_fake/requests`` serves a list)."""
        return {
            "server": self.server,
            "agent": self.agent,
            "task_index": self.task_index,
            "rollout_index": self.rollout_index,
            "attempt_index": self.attempt_index,
            "fault": self.fault,
            "run_id": self.run_id,
        }

    @property
    def key(self) -> tuple[int, int, int]:
        """Return ``(task, rollout, attempt)``."""
        return (self.task_index, self.rollout_index, self.attempt_index)


@define
class FakeStats:
    """Live counters of a fake deployment (shared by all its servers).

    Attributes:
        in_flight: ``/run`` requests being handled now, over the deployment.
        max_in_flight: the most ``/run`` requests ever handled at once.
        in_flight_by_server: the same per server instance name.
        max_in_flight_by_server: the most per server instance name.
        by_path: requests received by path (every endpoint).
        by_status: replies sent by HTTP status (scripted resets and hangs not counted).
        by_fault: ``/run`` requests by fault kind applied.
        runs_total: every ``/run`` received (with a parseable row).
        runs: the detailed log, when ``record_runs`` is on.
    """

    record_runs: bool = True
    in_flight: int = 0
    max_in_flight: int = 0
    in_flight_by_server: Counter[str] = field(factory=Counter)
    max_in_flight_by_server: Counter[str] = field(factory=Counter)
    by_path: Counter[str] = field(factory=Counter)
    by_status: Counter[int] = field(factory=Counter)
    by_fault: Counter[str] = field(factory=Counter)
    runs_total: int = 0
    runs: list[RunSeen] = field(factory=list)

    def run_started(self, server: str) -> None:
        """Count one ``/run`` entering its handler."""
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        now = self.in_flight_by_server[server] + 1
        self.in_flight_by_server[server] = now
        if now > self.max_in_flight_by_server[server]:
            self.max_in_flight_by_server[server] = now

    def run_ended(self, server: str) -> None:
        """Count one ``/run`` leaving its handler."""
        self.in_flight -= 1
        self.in_flight_by_server[server] -= 1

    def run_seen(
        self,
        server: str,
        agent: str | None,
        key: tuple[int, int, int],
        fault: str | None,
        *,
        traceparent: str | None = None,
        run_id: str | None = None,
    ) -> None:
        """Record one ``/run``: who got it, its (task, rollout, attempt), the fault applied,
        and the batch (run id) that sent it."""
        self.runs_total += 1
        if fault is not None:
            self.by_fault[fault] += 1
        if self.record_runs:
            self.runs.append(RunSeen(server, agent, *key, fault, traceparent, run_id))

    def run_keys(self) -> Counter[tuple[int, int, int]]:
        """Return how often each ``(task, rollout, attempt)`` was received."""
        return Counter(seen.key for seen in self.runs)

    def to_json(self) -> dict[str, Any]:
        """Return the counters as a JSON-able mapping (the detailed log left out)."""
        return {
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "in_flight_by_server": dict(self.in_flight_by_server),
            "max_in_flight_by_server": dict(self.max_in_flight_by_server),
            "by_path": dict(self.by_path),
            "by_status": {str(k): v for k, v in self.by_status.items()},
            "by_fault": dict(self.by_fault),
            "runs_total": self.runs_total,
        }
