"""Streaming, mergeable aggregation: local and server metrics, coverage, reports.

The public pieces: `aggregate_run` (what ``collect`` calls at the end of a run) and
`aggregate_shards` (``trollout aggregate``), their `AggregateOptions` and `AggregateResult`;
`resolve_inputs` for globs; the estimators; and the reports. Inside: `reader` (one streaming
pass), `identity` (a rollout's identity across runs: its task's content), `coverage` (latest
failures, imputed zeros), `exports` (NeMo Gym's exporter names), `batch` (batch manifests).
"""

from __future__ import annotations

from .aggregate import AggregateOptions, AggregateResult, aggregate_run, aggregate_shards
from .coverage import Coverage, coverage_lines
from .estimators import describe, majority_at_k, pass_at_k
from .report_html import render_report, write_report
from .report_text import print_report, summary_table
from .shards import resolve_inputs
from .summary import GroupSummary
from .views import Estimate, ViewSummary

__all__ = [
    "AggregateOptions",
    "AggregateResult",
    "Coverage",
    "Estimate",
    "GroupSummary",
    "ViewSummary",
    "aggregate_run",
    "aggregate_shards",
    "coverage_lines",
    "describe",
    "majority_at_k",
    "pass_at_k",
    "print_report",
    "render_report",
    "resolve_inputs",
    "summary_table",
    "write_report",
]
