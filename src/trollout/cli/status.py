"""`trollout status RUN`: where a run stands, printed (`trollout.run.status` reads it).

The status itself (resume's rules applied read-only, a distributed run summed over its shard
folders, the attempt cap from ``--max-attempts`` else the manifest else the environment) is the
run layer's (`trollout.run.status`); this command prints it for people, as one JSON object for
machines (``--json``), or as a live view (``--watch``, `status_watch`). A shard not complete
gets a line of its own; "never started" under "missing" counts the rows no attempt ever left
for (a batch cut early, a run stopped before its end).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import click
import orjson
from rich.console import Console

from ..errors import TrolloutError
from ..recovery.layout import RunLayout
from ..recovery.manifest import locate_run
from ..run.state import locate_sharded, status_of
from ..text import visible
from .failures import fail

__all__ = ["status"]


def _watch(layout: RunLayout, of_run: Callable[[], dict[str, Any]], interval_s: float) -> None:
    """Run the live view; Ctrl-C ends it with exit 130 (128 + SIGINT), no traceback."""
    from .status_watch import watch

    try:
        watch(
            layout, of_run, interval_s=interval_s, console=Console(highlight=False, soft_wrap=True)
        )
    except KeyboardInterrupt:
        click.echo("", err=True)
        sys.exit(128 + signal.SIGINT)


def _document(layout: RunLayout, **options: Any) -> dict[str, Any]:
    return status_of(layout, **options).document


_LINES = (
    ("landed", "landed"),
    ("failed, retryable", "failed"),
    ("missing", "missing"),
    ("at the attempt cap", "at_cap"),
    ("terminal", "terminal"),
    ("counted as zero", "counts_as_zero"),
)


def _print_human(doc: dict[str, Any]) -> None:
    # Paths, run ids and failure classes come from files and servers: shown escaped.
    for line in _human_lines(doc):
        click.echo(visible(line))


def _human_lines(doc: dict[str, Any]) -> list[str]:
    lines = [f"run {doc['run']}" + (f" (id {doc['run_id']})" if doc["run_id"] else "")]
    lines.append(f"  expected            {doc['expected']}")
    for label, key in _LINES:
        lines.append(f"  {label:<19} {doc[key]}")
        if key == "missing" and doc["not_started"]:  # of them: never sent (cut, stopped)
            lines.append(f"    never started     {doc['not_started']}")
    lines += [f"    {visible(name):<17} {n}" for name, n in doc["failures_by_class"].items()]
    if doc["duplicate_landed"] or doc["foreign_rows"]:
        lines.append(f"  duplicate landed    {doc['duplicate_landed']}")
        lines.append(f"  foreign rows        {doc['foreign_rows']}")
    if doc["collector_pid"] is not None:
        lines.append(f"  in use by pid {doc['collector_pid']}")
    shards = doc.get("shards")
    if shards is not None:
        done = len(shards["complete"])
        started = f"{shards['started']} of {shards['count']} started"
        lines.append(f"  shards              {started}, {done} complete")
        if shards["not_started"]:
            listed = ", ".join(map(str, shards["not_started"][:20]))
            lines.append(f"    not started       {listed}")
    health = doc.get("health")
    if health:
        counts = ", ".join(f"{n} {verdict}" for verdict, n in health.items())
        lines.append(f"  rollout health      {counts} (quality_summary.json)")
    if shards is not None and not shards["count"]:
        verdict = "no shard has started yet: nothing is known of this run"
    elif doc["complete"]:
        verdict = "complete: every rollout landed"
    elif doc["retryable_remains"]:
        verdict = f"retryable work remains: trollout resume would dispatch {doc['to_dispatch']}"
    else:
        verdict = "done, incomplete: nothing retryable remains (trollout resubmit sends it again)"
    lines.append(f"  {verdict} (max attempts {doc['max_attempts']})")
    return lines


@click.command()
@click.argument("run", type=click.Path(exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object for machines.")
@click.option("--max-attempts", type=int, help="Attempt cap to judge by (default: the run's).")
@click.option(
    "--retry-terminal-timeouts",
    is_flag=True,
    default=None,
    help="Judge terminal timeouts as retryable.",
)
@click.option(
    "--watch",
    is_flag=True,
    help="Keep showing progress, rate, ETA, failures, retries and stragglers until the run "
    "ends (Ctrl-C to stop watching).",
)
@click.option(
    "--interval",
    "interval_s",
    type=click.FloatRange(min=0.05, max=3600),
    default=1.0,
    show_default=True,
    help="Seconds between refreshes of --watch.",
)
def status(
    run: str,
    as_json: bool,
    max_attempts: int | None,
    retry_terminal_timeouts: bool | None,
    watch: bool,
    interval_s: float,
) -> None:
    """Show where RUN stands, from its files alone.

    Landed, failed by class, missing, at the attempt cap, terminal, and whether retryable work
    remains. Read from the run's files alone; no server is needed, and a collector may be running.
    """
    if watch and as_json:
        fail("--watch shows a live view for people; for machines, poll status --json instead")
    try:
        sharded = locate_sharded(run)
        layout = sharded or locate_run(run)
        of_run = partial(
            _document,
            layout,
            sharded=sharded is not None,
            max_attempts=max_attempts,
            retry_terminal_timeouts=retry_terminal_timeouts,
        )
        if watch:
            _watch(layout, of_run, interval_s)
            return
        doc = of_run()
    except TrolloutError as exc:
        fail(str(exc))
    if as_json:
        click.echo(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS).decode())
    else:
        _print_human(doc)
