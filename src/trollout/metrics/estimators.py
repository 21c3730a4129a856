"""Estimators: exact descriptive statistics, pass@k, majority@k, standard errors, intervals.

Everything here is a pure function of a multiset of numbers, so a statistic computed from merged
per-shard states equals the one computed on the union, bit for bit, whatever the split:

- `describe` matches Python's ``statistics`` module exactly: the mean is ``fmean`` (a correctly
  rounded sum divided by n), the median averages the two middle values, and the standard
  deviation is the *sample* one (n - 1, as NeMo Gym's pandas default), correctly rounded from
  exact integer arithmetic, like ``statistics.stdev``.
- `pass_at_k` is the unbiased estimator 1 - C(n-c, k) / C(n, k) in its stable product form;
  `majority_at_k` is the same idea for "more than half of k draws correct" (a tie counts half).
- Intervals are a seeded *Bayesian bootstrap over tasks* (Rubin 1981): a resample weights each
  task by a Dirichlet(1, ..., 1) draw. Tasks with identical statistics form one category whose
  total weight is a single Gamma(count) draw, so a resample costs O(distinct task outcomes)
  rather than O(tasks): with binary rewards and k repeats there are at most (k+1) categories
  per k. When there are more categories than ``max_categories`` (continuous rewards over many
  tasks), the interval falls back to the normal approximation with the task-clustered standard
  error, and says so (``method="normal"``).

Design note: the classic multinomial bootstrap was rejected because resampling T tasks costs
O(T) per resample in pure Python (250k tasks x 1000 resamples is minutes), and drawing the
multinomial counts per category needs a binomial sampler that Python 3.11 lacks. The Bayesian
bootstrap gives intervals of the same accuracy and aggregates exactly over categories.
"""

from __future__ import annotations

import math
import operator
import random
from collections.abc import Iterable, Sequence
from statistics import NormalDist
from typing import NamedTuple

from attrs import frozen

__all__ = [
    "ColumnStats",
    "Interval",
    "bootstrap_intervals",
    "cluster_standard_error",
    "describe",
    "majority_at_k",
    "pass_at_k",
    "sample_std",
    "standard_error",
]


class ColumnStats(NamedTuple):
    """NeMo Gym's default statistics of one column (``std`` None when n < 2)."""

    size: int
    mean: float
    max: float
    min: float
    median: float
    std: float | None


@frozen
class Interval:
    """A confidence interval and how it was computed (``bootstrap`` or ``normal``)."""

    low: float
    high: float
    method: str


def describe(values: Iterable[float]) -> ColumnStats:
    """Return mean, max, min, median and sample std of a non-empty multiset.

    Raises:
        ValueError: ``values`` is empty.
    """
    data = sorted(values)
    n = len(data)
    if not n:
        raise ValueError("describe() needs at least one value; skip empty columns")
    low, high = data[0], data[-1]
    if low == high:  # one value, or all equal: nothing to compute
        return ColumnStats(n, low, low, low, low, 0.0 if n > 1 else None)
    mid = n // 2
    median = data[mid] if n % 2 else (data[mid - 1] + data[mid]) / 2
    return ColumnStats(n, math.fsum(data) / n, high, low, median, sample_std(data))


def sample_std(values: Sequence[float]) -> float:
    """Return the sample standard deviation, correctly rounded (as ``statistics.stdev``)."""
    n = len(values)
    scaled, exponent = as_scaled_integers(values)
    sx = sum(scaled)
    sxx = sum(map(operator.mul, scaled, scaled))
    numerator = n * sxx - sx * sx  # n * sum of squared deviations, exact, scaled by 4**exponent
    return sqrt_of_fraction(numerator, n * (n - 1) << (2 * exponent))


def as_scaled_integers(values: Sequence[float]) -> tuple[list[int], int]:
    """Return integers I and e with values == I / 2**e exactly (floats are dyadic)."""
    ints = list(map(int, values))
    if ints == values:  # int == float compares exactly
        return ints, 0
    # v == m * 2**x with an integer 53-bit mantissa m, so v * 2**(53 - x) is an exact integer;
    # the largest such shift makes every value one (it is > 0: some value is not integral).
    exponent = max(53 - math.frexp(v)[1] for v in values if v)
    try:
        return [int(math.ldexp(v, exponent)) for v in values], exponent
    except OverflowError:  # a spread beyond the float range: scale the exact ratios instead
        ratios = [float(v).as_integer_ratio() for v in values]
        exponent = max(d.bit_length() - 1 for _, d in ratios)
        return [p << (exponent - (d.bit_length() - 1)) for p, d in ratios], exponent


_SQRT_BITS = 2 * 53 + 3


def sqrt_of_fraction(n: int, m: int) -> float:
    """Return sqrt(n / m) correctly rounded (round-to-odd then one float rounding)."""
    if n <= 0:
        return 0.0
    q = (n.bit_length() - m.bit_length() - _SQRT_BITS) // 2
    if q >= 0:
        return float(_isqrt_rto(n, m << 2 * q) << q)
    return _isqrt_rto(n << -2 * q, m) / (1 << -q)


def _isqrt_rto(n: int, m: int) -> int:
    a = math.isqrt(n // m)
    return a | (a * a * m != n)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Return the unbiased pass@k, 1 - C(n-c, k) / C(n, k), for c correct of n samples.

    Raises:
        ValueError: unless 0 <= c <= n and 1 <= k <= n.
    """
    _check_nck(n, c, k)
    if n - c < k:
        return 1.0
    failing = 1.0
    for i in range(n - c + 1, n + 1):
        failing *= 1.0 - k / i
    return 1.0 - failing


def majority_at_k(n: int, c: int, k: int) -> float:
    """Return P(more than half of k draws without replacement are correct); ties count half.

    Raises:
        ValueError: unless 0 <= c <= n and 1 <= k <= n.
    """
    _check_nck(n, c, k)
    total = math.comb(n, k)
    wins = sum(math.comb(c, j) * math.comb(n - c, k - j) for j in range(k // 2 + 1, k + 1))
    doubled = 2 * wins
    if k % 2 == 0:
        doubled += math.comb(c, k // 2) * math.comb(n - c, k // 2)
    return doubled / (2 * total)


def _check_nck(n: int, c: int, k: int) -> None:
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n (got n={n!r}, c={c!r}, k={k!r})")


def cluster_standard_error(tasks: Iterable[tuple[int, float, int]]) -> float | None:
    """Return the task-clustered standard error of a rollout-weighted mean.

    ``tasks`` yields ``(count, sum, n)``: ``count`` tasks whose rollouts sum to ``sum`` over
    ``n`` rollouts. The estimator is sum(S) / sum(N); its variance treats tasks, not
    rollouts, as the independent units. None when there are fewer than two tasks.
    """
    cats = [t for t in tasks if t[0] > 0 and t[2] > 0]
    n_tasks = sum(c for c, _, _ in cats)
    rollouts = sum(c * n for c, _, n in cats)
    if n_tasks < 2:
        return None
    mean = math.fsum(c * s for c, s, _ in cats) / rollouts
    spread = math.fsum(c * (s - mean * n) ** 2 for c, s, n in cats)
    return math.sqrt(n_tasks / (n_tasks - 1) * spread) / rollouts


def standard_error(values: Iterable[tuple[int, float]]) -> float | None:
    """Return the standard error of a mean over tasks, from ``(count, value)`` pairs."""
    pairs = [(c, v) for c, v in values if c > 0]
    n = sum(c for c, _ in pairs)
    if n < 2:
        return None
    mean = math.fsum(c * v for c, v in pairs) / n
    variance = math.fsum(c * (v - mean) ** 2 for c, v in pairs) / (n - 1)
    return math.sqrt(variance / n)


def normal_interval(value: float, std_error: float | None, level: float) -> Interval | None:
    """Return value ± z * std_error (None without a standard error)."""
    if std_error is None:
        return None
    z = NormalDist().inv_cdf(0.5 + level / 2)
    return Interval(value - z * std_error, value + z * std_error, "normal")


def bootstrap_intervals(
    counts: Sequence[int],
    ratios: Sequence[Sequence[tuple[float, float]]],
    *,
    samples: int,
    rng: random.Random,
    level: float,
) -> list[Interval | None]:
    """Return a Bayesian-bootstrap percentile interval for each ratio statistic.

    Args:
        counts: tasks in each category.
        ratios: per statistic, per category, ``(numerator, denominator)``; the statistic is
            sum(w * numerator) / sum(w * denominator) over categories, with w the resampled
            total weight of the category's tasks. A category a statistic does not cover has
            ``(0.0, 0.0)``.
        samples: resamples to draw (each costs one Gamma draw per category).
        rng: the seeded generator; the same seed gives the same intervals.
        level: coverage, e.g. 0.95.

    Returns:
        One interval per statistic, None for a statistic covering fewer than two tasks.
    """
    draws: list[list[float]] = [[] for _ in ratios]
    for _ in range(samples):
        weights = [rng.gammavariate(c, 1.0) for c in counts]
        for stat, cells in zip(ratios, draws, strict=True):
            den = math.fsum(w * d for w, (_, d) in zip(weights, stat, strict=True))
            if den > 0:
                cells.append(
                    math.fsum(w * x for w, (x, _) in zip(weights, stat, strict=True)) / den
                )
    covered = [sum(c for c, (_, d) in zip(counts, stat, strict=True) if d > 0) for stat in ratios]
    return [
        _percentiles(cells, level) if tasks >= 2 else None
        for cells, tasks in zip(draws, covered, strict=True)
    ]


def _percentiles(values: list[float], level: float) -> Interval:
    values.sort()
    tail = (1 - level) / 2
    last = len(values) - 1
    low = values[max(0, math.floor(tail * last))]
    high = values[min(last, math.ceil((1 - tail) * last))]
    return Interval(low, high, "bootstrap")
