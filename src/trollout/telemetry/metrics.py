"""Metrics: outcomes, rewards, retries, latency, and the collector's live state.

Design note. Two kinds of instrument, by what they cost the hot path:

- **pushed** by the observer hook (`runtime`): settled outcomes by outcome and failure class,
  rewards, attempt latency, retries and their waits; one counter or histogram call per event;
- **read when collected** (observable gauges and counters): requests in flight, rollouts held
  but not yet sending (queued), breaker state per endpoint, breaker transitions, and NeMo Gym
  0.7.0's failure and retry export names (``retries/attempts``, ``coverage/failed/<class>``,
  ... as ``_failure_export_metrics`` names them) as the ``name`` label of one gauge. They cost
  nothing per rollout; a collection (an OTLP export, a Prometheus scrape) reads the
  collector's counters from its own thread, which only ever reads plain ints.

Labels are bounded (`metric_failure_class`, after NeMo Gym's ``_metric_failure_kind``): a
producer may send any failure label, and a label per distinct string would grow without end.

After the run, the rollout health step (trollout.health) adds its counts once
(`RunMetrics.health_checked`): ``trollout.health.verdicts`` by ``verdict`` (healthy, unhealthy,
unobserved) and ``trollout.health.flagged`` by ``check`` (findings per check, flagged tasks for
the two task checks; `health_check_label` keeps the label to the 14 check ids and ``other``).
Both are read when collected, like the outcome counts, and have no points until the step ran.
The run's telemetry stays open through the health step (``collect_run``) so the last export
carries them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Final

from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.metrics import MeterProvider

from ..collector.dispatch.retry import BreakerState
from ..health import CHECKS
from ..records import Failed, FailureClass, Landed, OmitReason, Outcome

if TYPE_CHECKING:
    from ..collector.engine.collector import Collector

__all__ = ["LATENCY_BUCKETS_S", "RunMetrics", "health_check_label", "metric_failure_class"]

OTHER: Final = "other"
_KNOWN: Final = frozenset(member.value for member in FailureClass)
_CHECKS: Final = frozenset(CHECKS)
HEALTH_VERDICTS: Final = ("healthy", "unhealthy", "unobserved")
_NAMESPACED: Final = re.compile(r"[a-z][a-z0-9_]{0,31}\.[a-z0-9_.]{1,63}")
LATENCY_BUCKETS_S: Final = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
_WAIT_BUCKETS_S: Final = (0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60)
_REWARD_BUCKETS: Final = (0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1)


def metric_failure_class(label: str) -> str:
    """Return a failure label as a bounded metric label.

    trollout's own classes and namespaced names (``vendor.kind``) pass; anything else a
    producer sent is counted under ``other``.
    """
    if label in _KNOWN or _NAMESPACED.fullmatch(label):
        return label
    return OTHER


def health_check_label(check: str) -> str:
    """Return a health check id as a bounded metric label: one of the 14 ids, else ``other``."""
    return check if check in _CHECKS else OTHER


class RunMetrics:
    """The run's instruments on `provider`'s meter; the observer feeds the pushed ones.

    Args:
        provider: the meter provider (its readers export or serve the metrics).
        max_attempts: the run's attempt cap (``retries/max_attempts``, ``retries/at_cap``).
    """

    def __init__(self, provider: MeterProvider, *, max_attempts: int) -> None:
        meter = provider.get_meter("trollout")
        self.max_attempts = max_attempts
        self.collector: Collector | None = None
        self.expected: int | None = None
        self.exports: Counter[str] = Counter({"retries/attempts": 0, "retries/at_cap": 0})
        self._retried: set[tuple[int, int]] = set()
        # Counted in a plain Counter (0.3 us) and read when collected, rather than a pushed
        # OTel counter (13 us per call): settled outcomes are the one per-rollout event here.
        self.rollouts: Counter[tuple[str, str | None]] = Counter()
        self.health_verdicts: Counter[str] = Counter()
        self.health_flagged: Counter[str] = Counter()
        self.reward = meter.create_histogram(
            "trollout.reward",
            description="Rewards of landed, scored rollouts",
            explicit_bucket_boundaries_advisory=_REWARD_BUCKETS,
        )
        self.latency = meter.create_histogram(
            "trollout.attempt.duration",
            unit="s",
            description="Seconds per attempt (retries and waits included), by outcome",
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS_S,
        )
        self.retries = meter.create_counter(
            "trollout.retries", description="Re-sends, by reason (connect, http_429, ...)"
        )
        self.retry_wait = meter.create_histogram(
            "trollout.retry.wait",
            unit="s",
            description="Seconds waited before each re-send, by reason",
            explicit_bucket_boundaries_advisory=_WAIT_BUCKETS_S,
        )
        self._observe(meter)

    def _observe(self, meter: Meter) -> None:
        gauges: list[tuple[str, str, Callable[[CallbackOptions], Iterable[Observation]]]] = [
            ("trollout.in_flight", "Requests in flight now", self._in_flight),
            ("trollout.queued", "Rollouts held by workers, waiting to send", self._queued),
            ("trollout.rollouts.expected", "Rollouts this run dispatches", self._expected),
            ("trollout.breaker.state", "1 for each endpoint's breaker state", self._breakers),
            (
                "trollout.nemo_gym.export",
                "NeMo Gym 0.7.0's failure and retry exports",
                self._exports,
            ),
        ]
        for name, description, callback in gauges:
            meter.create_observable_gauge(name, [callback], description=description)
        meter.create_observable_counter(
            "trollout.rollouts",
            [self._rollouts],
            description="Rollouts settled, by outcome and failure class",
        )
        meter.create_observable_counter(
            "trollout.health.verdicts",
            [self._health_verdicts],
            description="Rollouts judged by the health check, by verdict",
        )
        meter.create_observable_counter(
            "trollout.health.flagged",
            [self._health_flagged],
            description="Health check findings by check (task checks: flagged tasks)",
        )
        meter.create_observable_counter(
            "trollout.breaker.transitions",
            [self._transitions],
            description="Circuit breaker transitions, by the state entered",
        )

    # --- pushed -------------------------------------------------------------------------

    def settled(self, outcome: Outcome, final: bool) -> None:
        """Count one outcome the writer settled (`final`: the rollout's last in this run)."""
        if isinstance(outcome, Failed):
            self._failed(outcome, final)
        elif isinstance(outcome, Landed):
            self._landed(outcome)
        else:
            drained = outcome.reason is OmitReason.DRAINED
            self.rollouts["drained" if drained else "omitted", None] += 1
        if final and outcome.attempt_index > 0:
            self._retried.add(outcome.identity.key)

    def _landed(self, outcome: Landed) -> None:
        self.rollouts["landed", None] += 1
        if outcome.elapsed_seconds is not None:
            self.latency.record(outcome.elapsed_seconds, {"outcome": "landed"})
        reward = outcome.reward
        if reward is not None:
            self.reward.record(reward)

    def _failed(self, outcome: Failed, final: bool) -> None:
        label = metric_failure_class(outcome.failure_class)
        if outcome.no_persist:
            self.rollouts["no_persist", label] += 1
            return
        self.exports["retries/attempts"] += 1
        if outcome.elapsed_seconds is not None:
            self.latency.record(outcome.elapsed_seconds, {"outcome": "failed"})
        if not final:
            return  # superseded by a new attempt: the rollout goes on
        self.rollouts["failed", label] += 1
        self.exports[f"coverage/failed/{label}"] += 1
        if outcome.attempt_index + 1 >= self.max_attempts:
            self.exports["retries/at_cap"] += 1

    def retry(self, reason: str, delay_s: float) -> None:
        """Count one re-send and its wait."""
        self.retries.add(1, {"reason": reason})
        self.retry_wait.record(delay_s, {"reason": reason})

    def health_checked(self, verdicts: Mapping[str, int], issues: Mapping[str, int]) -> None:
        """Count a health check's verdicts and findings per check (labels bounded)."""
        for verdict in HEALTH_VERDICTS:
            self.health_verdicts[verdict] += int(verdicts.get(verdict, 0))
        for check, count in issues.items():
            self.health_flagged[health_check_label(check)] += int(count)

    # --- read when collected ------------------------------------------------------------

    def _rollouts(self, options: CallbackOptions) -> Iterable[Observation]:
        for (outcome, label), count in list(self.rollouts.items()):
            attributes = {"outcome": outcome}
            if label is not None:
                attributes["failure_class"] = label
            yield Observation(count, attributes)

    def _health_verdicts(self, options: CallbackOptions) -> Iterable[Observation]:
        for verdict, count in sorted(self.health_verdicts.items()):
            yield Observation(count, {"verdict": verdict})

    def _health_flagged(self, options: CallbackOptions) -> Iterable[Observation]:
        for check, count in sorted(self.health_flagged.items()):
            yield Observation(count, {"check": check})

    def _in_flight(self, options: CallbackOptions) -> Iterable[Observation]:
        if self.collector is not None:
            yield Observation(self.collector.in_flight)

    def _queued(self, options: CallbackOptions) -> Iterable[Observation]:
        if self.collector is not None:
            yield Observation(max(0, self.collector.resident - self.collector.in_flight))

    def _expected(self, options: CallbackOptions) -> Iterable[Observation]:
        if self.expected is not None:
            yield Observation(self.expected)

    def _breakers(self, options: CallbackOptions) -> Iterable[Observation]:
        if self.collector is None:
            return
        for endpoint, health in list(self.collector.retry_state.endpoints.items()):
            for state in BreakerState:
                value = int(health.state is state)
                yield Observation(value, {"endpoint": endpoint, "state": state.value})

    def _transitions(self, options: CallbackOptions) -> Iterable[Observation]:
        if self.collector is None:
            return
        counts = self.collector.retry_state.counters.breaker_transitions
        for state in BreakerState:
            yield Observation(counts[state.value], {"state": state.value})

    def _exports(self, options: CallbackOptions) -> Iterable[Observation]:
        values = dict(self.exports)
        values["retries/rollouts_retried"] = len(self._retried)
        values["retries/max_attempts"] = self.max_attempts
        for name, value in sorted(values.items()):
            yield Observation(value, {"name": name})
