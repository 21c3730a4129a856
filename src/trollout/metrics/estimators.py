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

Any float in, never an exception out. Rewards and metric values are finite (JSON has no other
number; `stats` leaves a non-finite value an embedding driver passes out, as JSON would write it
null), but a buggy grader's ``1e308`` beside ``0.0`` makes sums and squares leave the float
range, which ``math.fsum`` and ``**`` raise for. Every statistic is first computed as always
(so moderate inputs give the same numbers, bit for bit); only when that raises or is not finite
is it computed again on exact rationals (`_finite_or`) and rounded once, to ±inf when its true
value is beyond the float range. A mean of finite values is always in range, so ``1e308`` beside
``0.0`` has the mean 5e307; a std or standard error past 1.8e308 is infinite, which the JSON
outputs write as null: not computable. A non-finite input gives IEEE's result (inf or NaN).
Rejected alternative: refusing rows whose reward exceeds some bound. Any bound is arbitrary
(token counts and latencies are metric columns too), and the overflow depends on the count of
rows as much as on the values; exact arithmetic on the rare overflow needs no bound.

Design note: the classic multinomial bootstrap was rejected because resampling T tasks costs
O(T) per resample in pure Python (250k tasks x 1000 resamples is minutes), and drawing the
multinomial counts per category needs a binomial sampler that Python 3.11 lacks. The Bayesian
bootstrap gives intervals of the same accuracy and aggregates exactly over categories.
"""

from __future__ import annotations

import math
import operator
import random
from collections.abc import Callable, Iterable, Sequence
from fractions import Fraction
from statistics import NormalDist
from typing import NamedTuple

from attrs import frozen

__all__ = [
    "ColumnStats",
    "Interval",
    "bootstrap_intervals",
    "cluster_standard_error",
    "describe",
    "exact_sum",
    "fmean",
    "majority_at_k",
    "pass_at_k",
    "sample_std",
    "scale_shift",
    "scale_up",
    "standard_error",
    "weighted_mean",
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
    median = data[mid] if n % 2 else midpoint(data[mid - 1], data[mid])
    return ColumnStats(n, fmean(data), high, low, median, sample_std(data))


def fmean(values: Sequence[float]) -> float:
    """Return ``statistics.fmean`` (a correctly rounded sum over n), never raising: when the
    sum leaves the float range, the exact mean rounded once (module docstring)."""
    n = len(values)
    return _finite_or(lambda: math.fsum(values) / n, lambda: _exact_sum(values) / n)


def exact_sum(values: Sequence[float]) -> float:
    """Return ``math.fsum``, never raising: ±inf when the sum is beyond the float range."""
    return _finite_or(lambda: math.fsum(values), lambda: _exact_sum(values))


def weighted_mean(pairs: Sequence[tuple[int, float]], total: int) -> float:
    """Return sum(count * value) / total (``math.fsum``), exact when that leaves the range."""
    return _finite_or(
        lambda: math.fsum(c * v for c, v in pairs) / total,
        lambda: sum((c * Fraction(v) for c, v in pairs), Fraction(0)) / total,
    )


def midpoint(a: float, b: float) -> float:
    """Return (a + b) / 2, also when a + b alone would overflow (two values near 1.8e308)."""
    m = (a + b) / 2
    if math.isinf(m) and math.isfinite(a) and math.isfinite(b):
        return a / 2 + b / 2
    return m


def sample_std(values: Sequence[float]) -> float:
    """Return the sample standard deviation, correctly rounded (as ``statistics.stdev``);
    inf beyond the float range, NaN when a value is not finite."""
    n = len(values)
    try:
        scaled, exponent = as_scaled_integers(values)
    except (OverflowError, ValueError):  # int() of an inf or a NaN
        return math.nan
    sx = sum(scaled)
    sxx = sum(map(operator.mul, scaled, scaled))
    numerator = n * sxx - sx * sx  # n * sum of squared deviations, exact, scaled by 4**exponent
    return sqrt_of_fraction(numerator, n * (n - 1) << (2 * exponent))


def _finite_or(fast: Callable[[], float], exact: Callable[[], Fraction | float]) -> float:
    """Return ``fast()`` when it is a finite number, else ``exact()`` rounded once.

    ``exact`` computes on `Fraction` s, so it raises (OverflowError, ValueError) only for an
    input that is not finite, where ``fast``'s IEEE result (inf, NaN) is the answer.
    """
    try:
        value = fast()
    except (OverflowError, ValueError):  # fsum's intermediate overflow, or inf - inf
        value = math.nan
    if math.isfinite(value):
        return value
    try:
        found = exact()
    except (OverflowError, ValueError):  # Fraction(inf), Fraction(nan): no exact value
        return value
    return _to_float(found)


def _exact_sum(values: Iterable[float]) -> Fraction:
    return sum(map(Fraction, values), Fraction(0))


def _to_float(q: Fraction | float) -> float:
    """Round an exact value to a float once: ±inf beyond the float range."""
    try:
        return float(q)
    except OverflowError:
        return math.inf if q > 0 else -math.inf


def _sqrt(q: Fraction) -> float:
    return sqrt_of_fraction(q.numerator, q.denominator)


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
    """Return sqrt(n / m) correctly rounded (round-to-odd then one float rounding); inf when
    it is beyond the float range."""
    if n <= 0:
        return 0.0
    q = (n.bit_length() - m.bit_length() - _SQRT_BITS) // 2
    if q >= 0:
        return _to_float(_isqrt_rto(n, m << 2 * q) << q)
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

    def fast() -> float:
        mean = math.fsum(c * s for c, s, _ in cats) / rollouts
        spread = math.fsum(c * (s - mean * n) ** 2 for c, s, n in cats)
        return math.sqrt(n_tasks / (n_tasks - 1) * spread) / rollouts

    def exact() -> float:
        mean = sum((c * Fraction(s) for c, s, _ in cats), Fraction(0)) / rollouts
        spread = sum((c * (Fraction(s) - mean * n) ** 2 for c, s, n in cats), Fraction(0))
        return _sqrt(n_tasks * spread / ((n_tasks - 1) * rollouts * rollouts))

    return _finite_or(fast, exact)


def standard_error(values: Iterable[tuple[int, float]]) -> float | None:
    """Return the standard error of a mean over tasks, from ``(count, value)`` pairs."""
    pairs = [(c, v) for c, v in values if c > 0]
    n = sum(c for c, _ in pairs)
    if n < 2:
        return None

    def fast() -> float:
        mean = math.fsum(c * v for c, v in pairs) / n
        variance = math.fsum(c * (v - mean) ** 2 for c, v in pairs) / (n - 1)
        return math.sqrt(variance / n)

    def exact() -> float:
        mean = sum((c * Fraction(v) for c, v in pairs), Fraction(0)) / n
        squares = sum((c * (Fraction(v) - mean) ** 2 for c, v in pairs), Fraction(0))
        return _sqrt(squares / ((n - 1) * n))

    return _finite_or(fast, exact)


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
                try:
                    num = math.fsum(w * x for w, (x, _) in zip(weights, stat, strict=True))
                except (OverflowError, ValueError):  # numerators past the range (`scale_shift`)
                    num = math.nan
                cells.append(num / den)
    covered = [sum(c for c, (_, d) in zip(counts, stat, strict=True) if d > 0) for stat in ratios]
    return [
        _percentiles(cells, level) if tasks >= 2 else None
        for cells, tasks in zip(draws, covered, strict=True)
    ]


# Values up to 2**960 leave sums of many weighted values far inside the float range.
_SAFE_EXPONENT = 960


def scale_shift(largest: float) -> int:
    """Return the power of two to scale values down by so that none exceeds 2**960.

    A statistic linear in its values (a mean, its standard error and interval) is computed on
    ``ldexp(v, -shift)`` and its result scaled back with `scale_up`: exact for the values that
    matter (one below 2**(shift - 1074) loses bits, far below the result's rounding). 0 (no
    scaling, nothing changes) unless a value's magnitude, ``largest``, is past 2**960.
    """
    if not math.isfinite(largest):
        return 0
    return max(0, math.frexp(largest)[1] - _SAFE_EXPONENT)


def scale_up(x: float, shift: int) -> float:
    """Return ``x * 2**shift`` (±inf beyond the float range; x itself when shift is 0)."""
    if not shift:
        return x
    try:
        return math.ldexp(x, shift)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def _percentiles(values: list[float], level: float) -> Interval:
    values.sort()
    tail = (1 - level) / 2
    last = len(values) - 1
    low = values[max(0, math.floor(tail * last))]
    high = values[min(last, math.ceil((1 - tail) * last))]
    return Interval(low, high, "bootstrap")
