"""Exact statistics over values held in many small pieces, without gathering them.

A group's column lives in its tasks' arrays. Gathering a million values into one Python list
(and sorting it, and squaring it exactly) costs some 100 MiB of short-lived objects per column,
which would make memory follow rows. These functions take a *factory* of chunks (called once per
pass) and compute, in a few passes and O(chunk) memory, exactly what `estimators.describe` would
compute on the concatenation:

- count, min, max, and the mean as a correctly rounded sum (``math.fsum`` streams) over n;
- the sample std from exact integer sums of the values scaled by one power of two;
- with few distinct values (rewards, token counts), everything from the value counts gathered
  in the first pass; otherwise the median by exact selection: bucket the candidate range into
  1024 bins, keep the bin that holds the wanted rank, and repeat until few candidates are left
  (or they are all equal), then sort those. Each pass is one sweep over the chunks.

Design note: the rejected alternatives were a sketch (t-digest, P²), whose median is
approximate and would not match NeMo Gym's, and a value counter, exact and mergeable but as large
as the data for continuous columns such as latencies.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence

from .estimators import ColumnStats, as_scaled_integers, describe, midpoint, sqrt_of_fraction

__all__ = ["Chunks", "describe_chunks", "kth_smallest"]

Chunks = Callable[[], Iterator[Sequence[float]]]  # a fresh iterator of chunks per call
_BINS = 1024
_FEW = 1 << 16  # candidates sorted directly below this many
_MAX_PASSES = 40
_MAX_DISTINCT = 4096  # columns with fewer distinct values are summarized from value counts


def describe_chunks(chunks: Chunks) -> ColumnStats | None:
    """Return `describe` of the concatenated chunks (None when there is no value).

    Values whose sums or spread leave the float range (``1e308`` beside ``-1e308``), or that
    are not finite, are described from one list by `describe`, which handles them (see
    `estimators`); the passes here assume a finite spread.
    """
    try:
        return _describe_chunks(chunks)
    except (OverflowError, ValueError):  # fsum's overflow; int() of an inf or a NaN
        return describe(list(itertools.chain.from_iterable(chunks())))


def _describe_chunks(chunks: Chunks) -> ColumnStats | None:
    n, low, high, integral = 0, math.inf, -math.inf, True
    counts: Counter[float] | None = Counter()
    for chunk in chunks():
        if chunk:
            n += len(chunk)
            low, high = min(low, min(chunk)), max(high, max(chunk))
            integral = integral and list(map(int, chunk)) == list(chunk)
            if counts is not None:
                counts.update(chunk)
                counts = counts if len(counts) <= _MAX_DISTINCT else None
    if n == 0:
        return None
    if n <= _FEW:
        return describe(itertools.chain.from_iterable(chunks()))
    if low == high:
        return ColumnStats(n, low, low, low, low, 0.0)
    if not math.isfinite(high - low):  # the bins below need a finite spread
        return describe(list(itertools.chain.from_iterable(chunks())))
    if counts is not None:
        return _from_counts(counts, n)
    mean = math.fsum(itertools.chain.from_iterable(chunks())) / n
    return ColumnStats(n, mean, high, low, _median(chunks, n, low, high), _std(chunks, n, integral))


def _from_counts(counts: Counter[float], n: int) -> ColumnStats:
    """Return the statistics of a multiset given as value counts (exact, like `describe`)."""
    keys = sorted(counts)
    scaled, exponent = as_scaled_integers(keys)
    sx = sum(counts[k] * v for k, v in zip(keys, scaled, strict=True))
    sxx = sum(counts[k] * v * v for k, v in zip(keys, scaled, strict=True))
    mean = sx / (1 << exponent) / n  # int / int is correctly rounded, as fsum is
    std = sqrt_of_fraction(n * sxx - sx * sx, n * (n - 1) << (2 * exponent))
    return ColumnStats(n, mean, keys[-1], keys[0], _counted_median(keys, counts, n), std)


def _counted_median(keys: Sequence[float], counts: Counter[float], n: int) -> float:
    ranks = (n // 2,) if n % 2 else (n // 2 - 1, n // 2)
    found: list[float] = []
    seen = 0
    for key in keys:
        seen += counts[key]
        while len(found) < len(ranks) and ranks[len(found)] < seen:
            found.append(key)
    return found[0] if n % 2 else midpoint(found[0], found[1])


def _median(chunks: Chunks, n: int, low: float, high: float) -> float:
    mid = n // 2
    if n % 2:
        return kth_smallest(chunks, mid, low, high)
    return midpoint(kth_smallest(chunks, mid - 1, low, high), kth_smallest(chunks, mid, low, high))


def _std(chunks: Chunks, n: int, integral: bool) -> float:
    exponent = 0
    if not integral:
        exponent = max(
            53 - math.frexp(v)[1] for chunk in chunks() for v in chunk if v and v != int(v)
        )
    sx = sxx = 0
    try:
        for chunk in chunks():
            scaled = [int(math.ldexp(v, exponent)) for v in chunk]
            sx += sum(scaled)
            sxx += sum(v * v for v in scaled)
    except OverflowError:  # a spread beyond the float range: fall back to one list
        values = list(itertools.chain.from_iterable(chunks()))
        return describe(values).std or 0.0
    return sqrt_of_fraction(n * sxx - sx * sx, n * (n - 1) << (2 * exponent))


def kth_smallest(chunks: Chunks, k: int, low: float, high: float) -> float:
    """Return the k-th smallest value (0-based) of the chunks, all within [low, high]."""
    below = 0  # values smaller than every candidate
    closed = True  # whether `high` itself is a candidate
    for _ in range(_MAX_PASSES):
        counts, seen_low, seen_high = _bin_counts(chunks, low, high, closed)
        if seen_low == seen_high:  # every candidate is one value
            return seen_low
        b, before = _bin_of(counts, k - below)
        below += before
        bounds = [low, *_edges(low, high), high]
        low, high, closed = bounds[b], bounds[b + 1], closed and b == _BINS - 1
        if counts[b] <= _FEW:
            break
    inside = _candidates(chunks, low, high, closed)
    inside.sort()
    return inside[k - below]


def _edges(low: float, high: float) -> list[float]:
    return [low + (high - low) * i / _BINS for i in range(1, _BINS)]


def _bin_counts(
    chunks: Chunks, low: float, high: float, closed: bool
) -> tuple[list[int], float, float]:
    """Count the candidates per bin in one sweep; also return their min and max."""
    edges = _edges(low, high)
    counts = [0] * _BINS
    seen_low, seen_high = math.inf, -math.inf
    for chunk in chunks():
        inside = _inside(chunk, low, high, closed)
        if inside:
            seen_low, seen_high = min(seen_low, min(inside)), max(seen_high, max(inside))
            for v in inside:
                counts[bisect.bisect_right(edges, v)] += 1
    return counts, seen_low, seen_high


def _inside(chunk: Sequence[float], low: float, high: float, closed: bool) -> list[float]:
    if closed:
        return [v for v in chunk if low <= v <= high]
    return [v for v in chunk if low <= v < high]


def _candidates(chunks: Chunks, low: float, high: float, closed: bool) -> list[float]:
    """Return the values in [low, high] (or [low, high) when not ``closed``)."""
    return [v for chunk in chunks() for v in _inside(chunk, low, high, closed)]


def _bin_of(counts: Sequence[int], rank: int) -> tuple[int, int]:
    """Return the bin holding ``rank`` and how many values precede that bin."""
    seen = 0
    for b, count in enumerate(counts):
        if rank < seen + count:
            return b, seen
        seen += count
    raise AssertionError(f"rank {rank} is beyond {seen} values")  # pragma: no cover


def chain_values(parts: Iterable[Callable[[], Iterator[Sequence[float]]]]) -> Chunks:
    """Return a chunk factory that yields every part's chunks in turn."""
    factories = list(parts)

    def chunks() -> Iterator[Sequence[float]]:
        for factory in factories:
            yield from factory()

    return chunks
