"""Per-group summaries: coverage, both views, local default metrics, chart data.

`summarize` turns a resolved `Collection` into one `GroupSummary` per group, sorted by label.
Everything a report shows is here, so the terminal table, ``--json``, the metrics file and the
HTML report read one record and never recompute.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import Any

import attrs
from attrs import frozen

from .coverage import Coverage, GroupKey
from .default_metrics import agent_metrics, column_chunks
from .estimators import scale_shift
from .exports import group_exports
from .reader import Collection
from .server import ServerOutcome
from .stats import GroupStats, popcount
from .streaming import Chunks
from .views import AS_ZERO, EXCLUDED, TaskRewards, ViewSummary, summarize_view

__all__ = ["GroupSummary", "Histogram", "SummaryOptions", "histogram", "summarize"]

_MAX_DISTINCT_BARS = 12


@frozen
class Histogram:
    """Bars for a chart: a label and a count each."""

    labels: tuple[str, ...]
    counts: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        """Return ``{labels, counts}``."""
        return {"labels": list(self.labels), "counts": list(self.counts)}


def histogram(chunks: Chunks, *, bins: int = 20) -> Histogram | None:
    """Return a bar per distinct value when there are few, else ``bins`` equal-width bins.

    The values are finite (`stats` keeps no other), as large as floats go.
    """
    distinct: Counter[float] | None = Counter()
    n, low, high = 0, math.inf, -math.inf
    for chunk in chunks():
        if chunk:
            n, low, high = n + len(chunk), min(low, min(chunk)), max(high, max(chunk))
            if distinct is not None:
                distinct.update(chunk)
                distinct = distinct if len(distinct) <= _MAX_DISTINCT_BARS else None
    if not n:
        return None
    if distinct is not None:
        keys = sorted(distinct)
        return Histogram(tuple(_fmt(k) for k in keys), tuple(distinct[k] for k in keys))
    half = 0.5 if math.isinf(high - low) else 1.0  # a spread past the float range: halved
    width = (high * half - low * half) / bins
    counts = [0] * bins
    for chunk in chunks():
        for v in chunk:
            counts[min(bins - 1, int((v * half - low * half) / width))] += 1
    return Histogram(
        tuple(_fmt((low * half + i * width) / half) for i in range(bins)), tuple(counts)
    )


def _fmt(x: float) -> str:
    if x == int(x) and abs(x) < 1e15:
        return str(int(x))
    return f"{x:.3g}"


@frozen(kw_only=True)
class SummaryOptions:
    """How intervals are computed (see `estimators`)."""

    bootstrap_samples: int = 1000
    confidence: float = 0.95
    seed: int = 0
    max_bootstrap_categories: int = 2000
    max_attempts: int = 3


@frozen
class GroupSummary:
    """Everything reported about one group (an agent, or an environment server).

    Attributes:
        agent: ``agent_ref.name``, or None for rows routed by taskset.
        environment_server: the group's ``_ng_environment_server``, when its rows carry one.
        coverage: what the score covers.
        excluded: the "failures excluded" view.
        as_zero: the "failures as zero" view.
        local_metrics: NeMo Gym's default ``agent_metrics`` computed locally on the metric input.
        reward_histogram: landed rewards.
        latency_histogram: landed ``elapsed_seconds``.
        server: the ``/aggregate_metrics`` call for this group, when one was made.
        exports: NeMo Gym's exporter counts of the group (`exports`): failures by class,
            retries, and the masking view.
    """

    agent: str | None
    environment_server: str | None
    coverage: Coverage
    excluded: ViewSummary
    as_zero: ViewSummary
    local_metrics: dict[str, Any] = attrs.field(repr=False)
    reward_histogram: Histogram | None = attrs.field(default=None, repr=False)
    latency_histogram: Histogram | None = attrs.field(default=None, repr=False)
    server: ServerOutcome | None = None
    exports: dict[str, Any] = attrs.field(factory=dict, repr=False)

    @property
    def label(self) -> str:
        """The name shown for the group."""
        return self.agent or self.environment_server or "(no agent)"

    @property
    def key(self) -> GroupKey:
        """The group's key in the collection."""
        return (self.agent, None) if self.agent else (None, self.environment_server)

    @property
    def aggregation_error(self) -> str | None:
        """The server call's error, if it failed."""
        return self.server.error if self.server else None

    @property
    def metrics_source(self) -> str:
        """``server`` when a server answered for this group, else ``local``."""
        return "server" if self.server is not None and self.server.reply is not None else "local"

    def to_json(self) -> dict[str, Any]:
        """Return the summary as a JSON-able mapping (without chart data)."""
        return {
            "agent": self.agent,
            "environment_server": self.environment_server,
            "metrics_source": self.metrics_source,
            "aggregation_error": self.aggregation_error,
            "coverage": self.coverage.to_json(),
            EXCLUDED: self.excluded.to_json(),
            AS_ZERO: self.as_zero.to_json(),
            "local_agent_metrics": self.local_metrics,
            "export_metrics": self.exports,
        }


def summarize(collection: Collection, options: SummaryOptions) -> list[GroupSummary]:
    """Summarize every group of a resolved collection, sorted by label."""
    out = [
        _summarize_group(key, group, collection, options)
        for key, group in collection.groups.items()
    ]
    return sorted(out, key=lambda g: (g.label, g.environment_server or ""))


def _summarize_group(
    key: GroupKey, group: GroupStats, collection: Collection, options: SummaryOptions
) -> GroupSummary:
    env = next(iter(group.environment_servers), None) or key[1]
    label = key[0] or env or ""
    rewards = column_chunks([group], "reward")
    shift = scale_shift(_largest(rewards))  # 0 unless a buggy grader's 1e308 is there
    excluded = (TaskRewards.of(s.values("reward"), 0, shift) for s in group.tasks.values())
    as_zero = (
        TaskRewards.of(s.values("reward"), popcount(s.known & ~s.landed), shift)
        for s in group.tasks.values()
    )
    return GroupSummary(
        agent=key[0],
        environment_server=env,
        coverage=collection.coverage[key],
        excluded=_view(EXCLUDED, excluded, label, options, shift),
        as_zero=_view(AS_ZERO, as_zero, label, options, shift),
        local_metrics=agent_metrics(group, collection.imputed.get(key)),
        reward_histogram=histogram(rewards),
        latency_histogram=histogram(column_chunks([group], "elapsed_seconds")),
        exports=group_exports(collection, key, label or "(no agent)", options.max_attempts),
    )


def _view(
    name: str, tasks: Iterable[TaskRewards], label: str, options: SummaryOptions, shift: int
) -> ViewSummary:
    return summarize_view(
        name,
        tasks,
        samples=options.bootstrap_samples,
        seed=f"{options.seed}/{label}/{name}",
        level=options.confidence,
        max_categories=options.max_bootstrap_categories,
        shift=shift,
    )


def _largest(chunks: Chunks) -> float:
    """Return the largest magnitude among the values (0.0 for none)."""
    largest = 0.0
    for chunk in chunks():
        if chunk:
            largest = max(largest, max(chunk), -min(chunk))
    return largest
