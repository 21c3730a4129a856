"""The terminal report: coverage lines and one table row per agent and view (rich)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from .coverage import coverage_lines
from .summary import GroupSummary
from .views import Estimate, ViewSummary

if TYPE_CHECKING:
    from .aggregate import AggregateResult

__all__ = ["print_report", "summary_table"]


def summary_table(groups: Sequence[GroupSummary]) -> Table:
    """Return the table: one row per group, both views, pass@1 and pass@k.

    Kept to a terminal's width: the mean reward with its interval in both views ("failures
    excluded" and "failures as zero"), pass@1, and pass@k at the largest k every task of the
    group reached (a larger k would silently score only the tasks that have more rollouts).
    The JSON output and the HTML report carry every k; `print_report` lists, under the table,
    what did not land in each group, by class.
    """
    table = Table(title="metrics (mean reward with 95% CI)", title_justify="left")
    table.add_column("agent")
    table.add_column("coverage", justify="right")
    table.add_column("failures\nexcluded", justify="right")
    table.add_column("failures\nas zero", justify="right")
    table.add_column("pass@1", justify="right")
    table.add_column("pass@k", justify="right")
    for g in groups:
        cov = g.coverage
        share = f"{cov.covered}/{cov.expected}" + (
            f" {100 * cov.covered / cov.expected:.0f}%" if cov.expected else ""
        )
        table.add_row(
            g.label,
            share,
            _estimate(g.excluded.mean_reward),
            _estimate(g.as_zero.mean_reward),
            _estimate(g.excluded.pass_at_k.get(1), short=True),
            _largest_full_k(g.excluded),
        )
    return table


def _largest_full_k(view: ViewSummary) -> str:
    full = [k for k, e in view.pass_at_k.items() if k > 1 and e.tasks == view.tasks]
    if not full:
        return "–"
    k = max(full)
    return f"@{k} {_estimate(view.pass_at_k[k], short=True)}"


def _estimate(e: Estimate | None, *, short: bool = False) -> str:
    if e is None:
        return "–"
    if e.interval is None or short:
        return f"{e.value:.3f}"
    return f"{e.value:.3f}\n[{e.interval.low:.2f},{e.interval.high:.2f}]"


def print_report(result: AggregateResult, console: Console) -> None:
    """Print the input findings, the coverage report, the table and any server errors."""
    for line in result.inputs.lines():
        console.print(f"[yellow]note:[/] {line}", highlight=False)
    for line in coverage_lines(result.coverage):
        console.print(line, highlight=False)
    console.print(summary_table(list(result.groups)))
    for group in result.groups:
        missing = ", ".join(f"{c} {n}" for c, n in group.coverage.did_not_land().items())
        if missing:
            console.print(f"{group.label}: did not land: {missing}", highlight=False)
    for group in result.groups:
        if group.aggregation_error:
            console.print(
                f"[red]server metrics failed for {group.label}:[/] {group.aggregation_error}",
                highlight=False,
            )
