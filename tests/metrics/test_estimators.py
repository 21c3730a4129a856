"""Estimators: exactness against the closed forms and the statistics module."""

from __future__ import annotations

import itertools
import math
import random
import statistics
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trollout.metrics.estimators import (
    bootstrap_intervals,
    cluster_standard_error,
    describe,
    majority_at_k,
    pass_at_k,
    sample_std,
    standard_error,
)
from trollout.metrics.views import TaskRewards, ks_for, summarize_view


@st.composite
def nck(draw: st.DrawFn, max_n: int = 200) -> tuple[int, int, int]:
    """Draw (n, c, k) with 0 <= c <= n and 1 <= k <= n."""
    n = draw(st.integers(1, max_n))
    return n, draw(st.integers(0, n)), draw(st.integers(1, n))


@given(nck())
def test_pass_at_k_equals_closed_form(args: tuple[int, int, int]) -> None:
    """pass@k equals 1 - C(n-c, k) / C(n, k) computed exactly."""
    n, c, k = args
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12)


@given(nck(max_n=9))
def test_majority_at_k_equals_enumeration(args: tuple[int, int, int]) -> None:
    """majority@k equals the share of k-subsets with a correct majority (ties count half)."""
    n, c, k = args
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(samples, k))
    score = sum(1.0 if 2 * sum(s) > k else 0.5 if 2 * sum(s) == k else 0.0 for s in subsets)
    assert majority_at_k(n, c, k) == pytest.approx(score / len(subsets), abs=1e-12)


def test_pass_at_k_rejects_impossible_counts() -> None:
    """pass@k refuses k > n with a message naming the values."""
    with pytest.raises(ValueError, match="n=2, c=1, k=3"):
        pass_at_k(2, 1, 3)


numbers = st.one_of(
    st.integers(-(10**6), 10**6).map(float),
    st.floats(-1e9, 1e9, allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, 1.0, 0.1, 0.7, 1e-300, 3.5]),
)


@given(st.lists(numbers, min_size=1, max_size=40))
def test_describe_matches_statistics_module(values: list[float]) -> None:
    """describe equals the statistics module (the mean to the last ulp or two: sum order)."""
    got = describe(values)
    assert got.mean == pytest.approx(statistics.fmean(values), rel=1e-12, abs=1e-300)
    assert (got.max, got.min) == (max(values), min(values))
    assert got.median == statistics.median(values)
    assert got.std == (statistics.stdev(values) if len(values) > 1 else None)


@given(st.lists(numbers, min_size=2, max_size=40), st.randoms(use_true_random=False))
def test_sample_std_ignores_order(values: list[float], rng: random.Random) -> None:
    """The standard deviation of a multiset does not depend on the order of its values."""
    shuffled = list(values)
    rng.shuffle(shuffled)
    assert sample_std(values) == sample_std(shuffled)


def test_sample_std_matches_nemo_gym_reference() -> None:
    """The sample std of the reference input tokens is NeMo Gym's 4.442221666388715."""
    tokens = [358, 357, 355, 357, 367, 358, 357, 355, 357, 367]
    assert sample_std([float(t) for t in tokens]) == 4.442221666388715


def test_cluster_standard_error_treats_tasks_as_units() -> None:
    """With one rollout per task the clustered SE is the usual SE of a mean."""
    values = [1.0, 0.0, 1.0, 1.0, 0.0]
    clustered = cluster_standard_error((1, v, 1) for v in values)
    assert clustered == pytest.approx(statistics.stdev(values) / math.sqrt(5))
    assert standard_error((1, v) for v in values) == pytest.approx(clustered)
    assert cluster_standard_error([(1, 1.0, 1)]) is None


def test_bootstrap_intervals_are_seeded() -> None:
    """The same seed gives the same interval; another seed a different one."""
    counts = [30, 50, 20]
    ratios = [[(0.0, 4.0), (2.0, 4.0), (4.0, 4.0)]]

    def run(seed: int) -> object:
        return bootstrap_intervals(counts, ratios, samples=300, rng=random.Random(seed), level=0.95)

    assert run(1) == run(1)
    assert run(1) != run(2)
    (interval,) = run(1)
    assert interval is not None
    assert interval.low < 0.5 < interval.high


def test_bootstrap_interval_of_a_constant_is_a_point() -> None:
    """Tasks that all score 1 give the interval [1, 1]; one task gives no interval."""
    got = bootstrap_intervals([7], [[(3.0, 3.0)]], samples=50, rng=random.Random(0), level=0.9)
    assert got[0] is not None
    assert (got[0].low, got[0].high) == (1.0, 1.0)
    assert bootstrap_intervals([1], [[(1.0, 1.0)]], samples=5, rng=random.Random(0), level=0.9) == [
        None
    ]


def test_ks_for_lists_powers_of_two_and_the_maximum() -> None:
    """k runs 1, 2, 4, ... and ends at the largest rollout count."""
    assert ks_for(1) == [1]
    assert ks_for(4) == [1, 2, 4]
    assert ks_for(6) == [1, 2, 4, 6]


def test_summarize_view_pass_at_1_averages_tasks() -> None:
    """pass@1 averages per-task success rates; the mean weights rollouts; k > n skips tasks."""
    tasks = [TaskRewards.of([1.0, 1.0, 0.0, 0.0]), TaskRewards.of([1.0, 0.0])]
    view = summarize_view("v", tasks, samples=100)
    assert view.mean_reward is not None
    assert view.mean_reward.value == pytest.approx(3 / 6)
    assert view.pass_at_k[1].value == pytest.approx((0.5 + 0.5) / 2)
    assert view.pass_at_k[4].tasks == 1
    assert view.pass_at_k[4].value == pytest.approx(1.0)
    assert view.majority_at_k[2].value == pytest.approx(
        (majority_at_k(4, 2, 2) + majority_at_k(2, 1, 2)) / 2
    )


def test_summarize_view_falls_back_to_normal_intervals() -> None:
    """Too many distinct task outcomes use the normal approximation, and say so."""
    tasks = [TaskRewards.of([i / 100]) for i in range(50)]
    view = summarize_view("v", tasks, samples=100, max_categories=10)
    assert view.binary is False
    assert view.pass_at_k == {}
    assert view.mean_reward is not None
    assert view.mean_reward.interval is not None
    assert view.mean_reward.interval.method == "normal"
