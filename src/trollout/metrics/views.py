"""The two honest views of a score: "failures excluded" and "failures as zero".

- **failures excluded**: the landed, scored rollouts only (what the model did when it ran).
- **failures as zero**: every planned rollout, a rollout that did not land (failed, omitted or
  never run) counting as reward 0 (the pessimistic bound; the truth lies between the two).

Masked and unscored landed rows are in neither view. Each view reports the rollout-weighted mean
reward with its task-clustered standard error and interval, and, for binary rewards (every
reward 0 or 1), pass@k and majority@k averaged over the tasks with at least k rollouts, for k in
1, 2, 4, ... up to the largest rollout count; pass@1 is the per-task success rate averaged over
tasks ("pass@1 averaged over k"). Values are fractions in [0, 1] (NeMo Gym's server-side pass@k
is in percent). Intervals are seeded, see `estimators`.

A reward too large for the sums (a buggy grader's ``1e308``) never raises: the caller scales
the rewards by a power of two (`estimators.scale_shift`, a no-op below 2**960) and the mean,
its error and interval are scaled back, so a task whose rewards sum past the float range (two
of ``1e308``) still has its exact share; a statistic whose own value is beyond the range is
infinite, which the JSON outputs write as null ("not computable"; `estimators`).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, NamedTuple

import attrs
from attrs import frozen

from .estimators import (
    Interval,
    bootstrap_intervals,
    cluster_standard_error,
    exact_sum,
    majority_at_k,
    normal_interval,
    pass_at_k,
    scale_up,
    standard_error,
    weighted_mean,
)

__all__ = ["AS_ZERO", "EXCLUDED", "Estimate", "TaskRewards", "ViewSummary", "summarize_view"]

EXCLUDED: Final = "failures_excluded"
AS_ZERO: Final = "failures_as_zero"


class TaskRewards(NamedTuple):
    """One task's rewards in a view: rollouts, sum, correct (reward 1), all binary."""

    n: int
    total: float
    correct: int
    binary: bool

    @classmethod
    def of(cls, rewards: Sequence[float], zeros: int = 0, shift: int = 0) -> TaskRewards:
        """Summarize a task's rewards, plus ``zeros`` rollouts counted as 0; with ``shift``,
        the sum is of the rewards scaled by 2**-shift (`estimators.scale_shift`)."""
        correct = rewards.count(1.0)
        binary = correct + rewards.count(0.0) == len(rewards)
        if shift:
            rewards = [math.ldexp(r, -shift) for r in rewards]
        return cls(len(rewards) + zeros, exact_sum(rewards), correct, binary)


@frozen
class Estimate:
    """A statistic over tasks with its standard error and interval."""

    value: float
    std_error: float | None
    interval: Interval | None
    tasks: int

    def to_json(self) -> dict[str, Any]:
        """Return ``{value, std_error, ci_low, ci_high, ci_method, tasks}``."""
        iv = self.interval
        return {
            "value": self.value,
            "std_error": self.std_error,
            "ci_low": iv.low if iv else None,
            "ci_high": iv.high if iv else None,
            "ci_method": iv.method if iv else None,
            "tasks": self.tasks,
        }


@frozen
class ViewSummary:
    """One view of a group's score."""

    name: str
    rollouts: int
    tasks: int
    binary: bool
    mean_reward: Estimate | None
    pass_at_k: Mapping[int, Estimate] = attrs.field(factory=dict)
    majority_at_k: Mapping[int, Estimate] = attrs.field(factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Return the view as a JSON-able mapping (pass@k keyed ``pass@{k}``)."""
        return {
            "rollouts": self.rollouts,
            "tasks": self.tasks,
            "binary_rewards": self.binary,
            "mean_reward": self.mean_reward.to_json() if self.mean_reward else None,
            **{f"pass@{k}": e.to_json() for k, e in self.pass_at_k.items()},
            **{f"majority@{k}": e.to_json() for k, e in self.majority_at_k.items()},
        }


def ks_for(max_n: int) -> list[int]:
    """Return 1, 2, 4, ... up to ``max_n``, and ``max_n`` itself."""
    ks = [1 << i for i in range(max(max_n, 1).bit_length()) if 1 << i <= max_n]
    if max_n >= 1 and ks[-1] != max_n:
        ks.append(max_n)
    return ks


class _Stat(NamedTuple):
    kind: str  # "mean", "pass" or "majority"
    k: int
    value: float
    std_error: float | None
    tasks: int
    ratios: list[tuple[float, float]]  # per category, for the bootstrap


def summarize_view(
    name: str,
    tasks: Iterable[TaskRewards],
    *,
    samples: int = 1000,
    seed: str = "0",
    level: float = 0.95,
    max_categories: int = 2000,
    shift: int = 0,
) -> ViewSummary:
    """Summarize one view from per-task rewards (tasks with no rollout are ignored).

    ``shift``: the tasks' sums are of rewards scaled by 2**-shift (`TaskRewards.of`); the mean
    reward, its standard error and interval are scaled back. Rewards that large are not binary,
    so no pass@k needs it.
    """
    cats: Counter[tuple[int, float, int]] = Counter()
    binary = True
    for t in tasks:
        if t.n:
            cats[t.n, t.total, t.correct] += 1
            binary = binary and t.binary
    if not cats:
        return ViewSummary(name, 0, 0, binary=False, mean_reward=None)
    keys = sorted(cats)
    counts = [cats[k] for k in keys]
    stats = _statistics(keys, counts, binary)
    intervals = _intervals(stats, counts, samples, seed, level, max_categories)
    found = {
        (s.kind, s.k): Estimate(s.value, s.std_error, iv, s.tasks)
        for s, iv in zip(stats, intervals, strict=True)
    }
    return ViewSummary(
        name,
        rollouts=sum(c * n for c, (n, _, _) in zip(counts, keys, strict=True)),
        tasks=sum(counts),
        binary=binary,
        mean_reward=_scaled_up(found["mean", 0], shift),
        pass_at_k={k: e for (kind, k), e in found.items() if kind == "pass"},
        majority_at_k={k: e for (kind, k), e in found.items() if kind == "majority"},
    )


def _scaled_up(e: Estimate, shift: int) -> Estimate:
    if not shift:
        return e
    iv = e.interval
    return Estimate(
        scale_up(e.value, shift),
        None if e.std_error is None else scale_up(e.std_error, shift),
        None
        if iv is None
        else Interval(scale_up(iv.low, shift), scale_up(iv.high, shift), iv.method),
        e.tasks,
    )


def _statistics(
    keys: Sequence[tuple[int, float, int]], counts: Sequence[int], binary: bool
) -> list[_Stat]:
    """Return the mean's statistic, then pass@k and majority@k for binary rewards."""
    pairs = list(zip(counts, keys, strict=True))
    total = sum(c * n for c, (n, _, _) in pairs)
    mean = weighted_mean([(c, s) for c, (_, s, _) in pairs], total)
    se = cluster_standard_error((c, s, n) for c, (n, s, _) in pairs)
    out = [_Stat("mean", 0, mean, se, sum(counts), [(s, float(n)) for n, s, _ in keys])]
    if not binary:
        return out
    for kind, fn in (("pass", pass_at_k), ("majority", majority_at_k)):
        for k in ks_for(max(n for n, _, _ in keys)):
            if kind != "majority" or k > 1:
                out.append(_k_statistic(kind, k, fn, keys, counts))
    return out


def _k_statistic(
    kind: str,
    k: int,
    fn: Callable[[int, int, int], float],
    keys: Sequence[tuple[int, float, int]],
    counts: Sequence[int],
) -> _Stat:
    values = [fn(n, c, k) if n >= k else None for n, _, c in keys]
    pairs = [(cnt, v) for cnt, v in zip(counts, values, strict=True) if v is not None]
    covered = sum(cnt for cnt, _ in pairs)
    value = math.fsum(cnt * v for cnt, v in pairs) / covered
    ratios = [(v, 1.0) if v is not None else (0.0, 0.0) for v in values]
    return _Stat(kind, k, value, standard_error(pairs), covered, ratios)


def _intervals(
    stats: Sequence[_Stat], counts: Sequence[int], samples: int, seed: str, level: float, limit: int
) -> list[Interval | None]:
    if samples > 0 and len(counts) <= limit:
        rng = random.Random(seed)
        ratios = [s.ratios for s in stats]
        return bootstrap_intervals(counts, ratios, samples=samples, rng=rng, level=level)
    return [normal_interval(s.value, s.std_error, level) for s in stats]
