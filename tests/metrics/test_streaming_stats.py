"""Chunked statistics equal the statistics of the concatenated values, without gathering them."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from unittest import mock

from hypothesis import given
from hypothesis import strategies as st

from trollout.metrics import streaming
from trollout.metrics.estimators import describe
from trollout.metrics.streaming import describe_chunks, kth_smallest

values = st.one_of(
    st.integers(-50, 50).map(float),
    st.floats(-1e6, 1e6, allow_nan=False, allow_subnormal=False),
    st.sampled_from([0.0, 1.0]),
)


def chunked(data: list[float], rng: random.Random) -> streaming.Chunks:
    """Split ``data`` into random chunks, some empty; return a chunk factory."""
    cuts = sorted(rng.randrange(len(data) + 1) for _ in range(rng.randrange(6)))
    bounds = [0, *cuts, len(data)]
    pieces = [data[a:b] for a, b in itertools.pairwise(bounds)]

    def chunks() -> Iterator[Sequence[float]]:
        return iter(pieces)

    return chunks


@given(
    st.lists(values, min_size=1, max_size=300),
    st.randoms(use_true_random=False),
    st.sampled_from([0, 8, 4096]),
)
def test_describe_chunks_equals_describe(
    data: list[float], rng: random.Random, max_distinct: int
) -> None:
    """Mean, extremes, median and std match `describe` bit for bit: value counts or selection."""
    with (
        mock.patch.object(streaming, "_FEW", 4),
        mock.patch.object(streaming, "_MAX_DISTINCT", max_distinct),
    ):
        assert describe_chunks(chunked(data, rng)) == describe(data)


@given(st.lists(values, min_size=1, max_size=200), st.data())
def test_kth_smallest_selects_exactly(data: list[float], pick: st.DataObject) -> None:
    """Every rank is found exactly, ties and all, with tiny candidate budgets."""
    k = pick.draw(st.integers(0, len(data) - 1))
    with mock.patch.object(streaming, "_FEW", 2):
        got = kth_smallest(lambda: iter([data]), k, min(data), max(data))
    assert got == sorted(data)[k]


def test_describe_chunks_of_nothing_is_none() -> None:
    """No value, no statistics."""
    assert describe_chunks(lambda: iter([[], []])) is None


def test_kth_smallest_with_heavy_ties_takes_few_passes() -> None:
    """A million-like column of two values is settled without sorting it."""
    data = [0.0] * 5000 + [1.0] * 7000
    passes = 0

    def chunks() -> Iterator[Sequence[float]]:
        nonlocal passes
        passes += 1
        return iter([data])

    with mock.patch.object(streaming, "_FEW", 100):
        assert kth_smallest(chunks, 6000, 0.0, 1.0) == 1.0
    assert passes <= 3
