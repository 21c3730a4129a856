"""The terminal report: coverage lines and one table row per agent and view (rich)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from .coverage import coverage_lines
from .summary import GroupSummary
from .views import Estimate

if TYPE_CHECKING:
    from .aggregate import AggregateResult

__all__ = ["print_report", "summary_table"]


def summary_table(groups: Sequence[GroupSummary]) -> Table:
    """Return the table: per group, one row per view, with coverage and failures by class."""
    ks = sorted({k for g in groups for v in (g.excluded, g.as_zero) for k in v.pass_at_k})
    table = Table(title="trollout aggregate", title_justify="left")
    for name in ("agent", "view", "n", "coverage", "mean reward [95% CI]"):
        table.add_column(name, justify="left" if name in ("agent", "view") else "right")
    for k in ks:
        table.add_column(f"pass@{k}", justify="right")
    table.add_column("did not land", justify="left")
    for g in groups:
        cov = g.coverage
        share = f"{cov.covered}/{cov.expected}" + (
            f" ({100 * cov.covered / cov.expected:.0f}%)" if cov.expected else ""
        )
        missing = ", ".join(f"{c} {n}" for c, n in cov.did_not_land().items()) or "–"
        for i, view in enumerate((g.excluded, g.as_zero)):
            table.add_row(
                g.label if i == 0 else "",
                view.name.replace("_", " "),
                str(view.rollouts),
                share if i == 0 else "",
                _estimate(view.mean_reward),
                *(_estimate(view.pass_at_k.get(k), short=True) for k in ks),
                missing if i == 0 else "",
                end_section=i == 1,
            )
    return table


def _estimate(e: Estimate | None, *, short: bool = False) -> str:
    if e is None:
        return "–"
    if e.interval is None or short:
        return f"{e.value:.3f}"
    return f"{e.value:.3f} [{e.interval.low:.3f}, {e.interval.high:.3f}]"


def print_report(result: AggregateResult, console: Console) -> None:
    """Print the input findings, the coverage report, the table and any server errors."""
    for line in result.inputs.lines():
        console.print(f"[yellow]note:[/] {line}", highlight=False)
    for line in coverage_lines(result.coverage):
        console.print(line, highlight=False)
    console.print(summary_table(list(result.groups)))
    for group in result.groups:
        if group.aggregation_error:
            console.print(
                f"[red]server metrics failed for {group.label}:[/] {group.aggregation_error}",
                highlight=False,
            )
