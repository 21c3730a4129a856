"""The terminal report: coverage lines and one table row per agent and view (rich).

Agent and server names, failure classes, paths and server errors are data: every one goes to
rich inside a `Text` (never parsed as markup, whatever the console) after `visible` has escaped
its control characters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..text import visible
from .coverage import coverage_lines
from .summary import GroupSummary
from .views import Estimate, ViewSummary

if TYPE_CHECKING:
    from .result import AggregateResult

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
        numbers = (
            share,
            _estimate(g.excluded.mean_reward),
            _estimate(g.as_zero.mean_reward),
            _estimate(g.excluded.pass_at_k.get(1), short=True),
            _largest_full_k(g.excluded),
        )
        table.add_row(_data(g.label), *(Text(cell) for cell in numbers))
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
        console.print(Text.assemble(("note:", "yellow"), " ", _data(line)))
    for line in coverage_lines(result.coverage):
        console.print(_data(line))
    console.print(summary_table(list(result.groups)))
    for group in result.groups:
        missing = ", ".join(f"{c} {n}" for c, n in group.coverage.did_not_land().items())
        if missing:
            console.print(_data(f"{group.label}: did not land: {missing}"))
    for group in result.groups:
        if group.aggregation_error:
            failed = _data(f"server metrics failed for {group.label}:", style="red")
            console.print(Text.assemble(failed, " ", _data(group.aggregation_error)))


def _data(text: str, *, style: str = "") -> Text:
    """Return external text for rich: control characters escaped, never read as markup."""
    return Text(visible(text), style=style)
