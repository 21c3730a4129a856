"""What an aggregation found and wrote (`AggregateResult`), read by both reports.

Its own module, below `aggregate` (which builds it) and `report_html` / `report_text` (which
render it): the result defined in `aggregate` made the HTML report and the aggregation import
each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attrs import frozen

from .coverage import Coverage, coverage_lines
from .reader import InputReport
from .summary import GroupSummary

__all__ = ["AggregateResult"]


@frozen
class AggregateResult:
    """What an aggregation found and wrote.

    Attributes:
        groups: one summary per agent or environment server, sorted by label.
        inputs: the shards read, files skipped, duplicates and torn lines.
        metrics_path: the ``<stem>_aggregate_metrics.json`` written.
        report_path: the HTML report written, or None.
        merged_path: the merged rollouts file written, or None.
        warnings: one line per shard whose status file was not marked, and why.
    """

    groups: tuple[GroupSummary, ...]
    inputs: InputReport
    metrics_path: Path
    report_path: Path | None = None
    merged_path: Path | None = None
    warnings: tuple[str, ...] = ()

    @property
    def coverage(self) -> Coverage:
        """The coverage of all groups together."""
        total = Coverage()
        for group in self.groups:
            total = total + group.coverage
        return total

    @property
    def server_errors(self) -> tuple[str, ...]:
        """The error of every failed ``/aggregate_metrics`` call."""
        return tuple(g.aggregation_error for g in self.groups if g.aggregation_error)

    @property
    def ok(self) -> bool:
        """Whether every server call asked for succeeded."""
        return not self.server_errors

    def to_json(self) -> dict[str, Any]:
        """Return the whole result as a JSON-able mapping (``trollout aggregate --json``)."""
        return {
            "ok": self.ok,
            "coverage": self.coverage.to_json(),
            "coverage_report": coverage_lines(self.coverage),
            "inputs": self.inputs.to_json(),
            "warnings": list(self.warnings),
            "groups": [g.to_json() for g in self.groups],
            "files": {
                "merged": str(self.merged_path) if self.merged_path else None,
                "metrics": str(self.metrics_path),
                "report": str(self.report_path) if self.report_path else None,
            },
        }
