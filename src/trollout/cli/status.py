"""`trollout status RUN`: where a run stands, from its files alone (no server needed).

It applies resume's rules (`recovery.resume.scan_run`) without the lock and without writing,
so it may run beside a collector that is writing the folder: a torn last line is skipped.
The attempt cap is ``--max-attempts``, else the one saved in the manifest, else the
environment's (``NEMO_GYM_MAX_ROLLOUT_ATTEMPTS``, default 3).

A distributed run (`trollout.scaleout`: a Ray run, or the shards of a Slurm array) is shown as
the sum of its shard folders (`sharded_status`), with one line per shard that is not complete.
RUN is then the run's output file, manifest or folder (a Ray run), or its ``<stem>_shards``
folder (a Slurm array, whose merged output does not exist until ``trollout aggregate``).
Shards not started yet count as missing (and never started); when no manifest says how many
rollouts they hold (a Slurm array), ``expected`` counts only the shards that started.

``not_started`` (shown as "never started" under "missing") counts the missing rollouts of which
no attempt ever started: no outcome row but drained ones, and no attempt number in the ledger
that may have reached a server (numbers are reserved right before a request leaves). They are
the rows a batch cut early, or a run stopped before its end, never sent.
"""

from __future__ import annotations

import os
import signal
import sys
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import click
import orjson
from rich.console import Console

from ..errors import ConfigError, RunFolderLockedError, TrolloutError
from ..health import verdict_counts
from ..metrics.exports import run_exports
from ..records import RunManifest
from ..recovery.layout import RunLayout
from ..recovery.lock import RunLock, read_owner
from ..recovery.manifest import locate_run, read_manifest
from ..recovery.resume import Fate, ResumeRules, RunTally, scan_run
from ..scaleout.layout import ShardFolder, shard_folders
from ..settings import default_max_attempts
from ..text import visible
from .common import fail

__all__ = ["locate_sharded", "run_status", "sharded_status", "status"]

# Counts a sharded run's document sums over its shards.
_SUMMED = (
    "expected",
    "landed",
    "failed",
    "missing",
    "not_started",
    "at_cap",
    "terminal",
    "counts_as_zero",
    "to_dispatch",
    "failure_rows",
    "reserved_attempts",
    "duplicate_landed",
    "foreign_rows",
)


def run_status(
    layout: RunLayout,
    *,
    max_attempts: int | None = None,
    retry_terminal_timeouts: bool | None = None,
) -> dict[str, Any]:
    """Return the status document of a run (what ``status --json`` prints).

    Raises:
        RunFolderError: the materialized inputs are missing or a file is damaged mid-way.
    """
    manifest = read_manifest(layout)
    saved = manifest.settings if manifest is not None else {}
    cap = max_attempts or saved.get("max_attempts") or default_max_attempts()
    retry_timeouts = retry_terminal_timeouts
    if retry_timeouts is None:
        retry_timeouts = bool(saved.get("retry_terminal_timeouts", False))
    rules = ResumeRules(max_attempts=cap, retry_terminal_timeouts=retry_timeouts)
    tally = scan_run(layout, rules)
    doc = _document(layout, manifest, cap, tally.tally)
    # A folder that plans nothing (a Ray block given no task) has nothing to export, and the
    # metrics reader refuses a rollouts file that holds no row.
    doc["export_metrics"] = run_exports(layout, cap) if tally.tally.expected else {}
    doc["health"] = verdict_counts(layout.rollouts.parent)  # None: no health check ran
    return doc


def locate_sharded(path: str | os.PathLike[str]) -> RunLayout | None:
    """Return the run a RUN argument names when it is a distributed run, else None.

    Raises:
        ConfigError: RUN is a folder that holds no run or several.
    """
    p = Path(path)
    if p.is_dir() and p.name.endswith("_shards"):
        return RunLayout.for_output(p.with_name(p.name.removesuffix("_shards") + ".jsonl"))
    layout = locate_run(path)
    manifest = read_manifest(layout)
    if manifest is not None:
        return layout if isinstance(manifest.settings.get("ray_blocks"), int) else None
    return layout if shard_folders(layout.output) else None


def sharded_status(
    layout: RunLayout,
    *,
    max_attempts: int | None = None,
    retry_terminal_timeouts: bool | None = None,
) -> dict[str, Any]:
    """Return the status document of a distributed run: its shards' documents summed.

    Raises:
        ConfigError: the shards folder holds shards of several splits (``-of-4`` and ``-of-8``).
        RunFolderError: a shard's files are damaged mid-way.
    """
    manifest = read_manifest(layout)
    count = manifest.settings.get("ray_blocks") if manifest is not None else None
    folders = shard_folders(layout.output, count if isinstance(count, int) else None)
    counts = sorted({f.count for f in folders})
    if len(counts) > 1:
        raise ConfigError(
            f"the shards of {str(layout.output)!r} come from splits into {counts} shards; "
            "keep the folders of one split (name them in trollout aggregate)"
        )
    count = count if isinstance(count, int) else (counts[0] if counts else 0)
    started = {f.index: f for f in folders if f.layout.materialized_inputs.exists()}
    docs = {
        i: run_status(
            f.layout, max_attempts=max_attempts, retry_terminal_timeouts=retry_terminal_timeouts
        )
        for i, f in sorted(started.items())
    }
    return _sum_documents(layout, manifest, count, started, docs)


def _sum_documents(
    layout: RunLayout,
    manifest: RunManifest | None,
    count: int,
    started: dict[int, ShardFolder],
    docs: dict[int, dict[str, Any]],
) -> dict[str, Any]:
    total = {key: sum(doc[key] for doc in docs.values()) for key in _SUMMED}
    by_class: Counter[str] = Counter()
    for doc in docs.values():
        by_class.update(doc["failures_by_class"])
    unstarted = manifest.expected_rollouts - total["expected"] if manifest is not None else 0
    total["expected"] += unstarted
    total["missing"] += unstarted
    total["not_started"] += unstarted
    total["to_dispatch"] += unstarted
    not_started = [i for i in range(count) if i not in started]
    pids = [doc["collector_pid"] for doc in docs.values() if doc["collector_pid"] is not None]
    first = next(iter(docs.values()), None)
    return {
        "run": str(layout.output),
        "run_id": manifest.run_id if manifest else None,
        "has_manifest": manifest is not None,
        "max_attempts": first["max_attempts"] if first else default_max_attempts(),
        **total,
        "failures_by_class": dict(by_class),
        "retryable_remains": bool(not_started)
        or any(d["retryable_remains"] for d in docs.values()),
        # No shard found means nothing is known yet, not a run with nothing to do.
        "complete": count > 0 and not not_started and total["landed"] == total["expected"],
        "collector_pid": pids[0] if pids else None,
        "shards": {
            "count": count,
            "started": len(started),
            "not_started": not_started,
            "complete": [i for i, d in docs.items() if d["complete"]],
            "folders": {str(i): str(f.output) for i, f in started.items()},
            "collector_pids": pids,
        },
    }


def _document(
    layout: RunLayout, manifest: RunManifest | None, cap: int, tally: RunTally
) -> dict[str, Any]:
    return {
        "run": str(layout.output),
        "run_id": manifest.run_id if manifest else None,
        "has_manifest": manifest is not None,
        "max_attempts": cap,
        "expected": tally.expected,
        "landed": tally.count(Fate.LANDED),
        "failed": tally.count(Fate.FAILED),
        "missing": tally.count(Fate.MISSING),
        "not_started": tally.not_started,
        "at_cap": tally.count(Fate.AT_CAP),
        "terminal": tally.count(Fate.TERMINAL),
        "counts_as_zero": tally.count(Fate.ZERO),
        "failures_by_class": tally.failures_by_class,
        "to_dispatch": tally.to_dispatch,
        "retryable_remains": tally.retryable_remains,
        "complete": tally.count(Fate.LANDED) == tally.expected,
        "failure_rows": tally.failure_rows,
        "reserved_attempts": tally.reserved_attempts,
        "duplicate_landed": tally.duplicate_landed,
        "foreign_rows": tally.foreign_rows,
        "collector_pid": _live_owner(layout),
    }


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


def _live_owner(layout: RunLayout) -> int | None:
    """Return the pid the lock record names while the run's lock is held, else None.

    The lock itself decides, not the record: a SIGKILLed or OOM-killed collector (on this host or
    another node of a shared file system) leaves its record behind, and its pid may be reused.
    """
    owner = read_owner(layout.lock)
    if owner is None:
        return None
    try:
        RunLock.for_layout(layout).check_free()
    except RunFolderLockedError:
        return owner.pid
    return None


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
            sharded_status if sharded is not None else run_status,
            layout,
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
