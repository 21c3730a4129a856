"""`status`: where a run stands, from its files alone (no server needed).

It applies resume's rules (`recovery.resume.scan_run`) without the lock and without writing,
so it may run beside a collector that is writing the folder: a torn last line is skipped.
The attempt cap is ``max_attempts``, else the one saved in the manifest, else the
environment's (``NEMO_GYM_MAX_ROLLOUT_ATTEMPTS``, default 3).

A distributed run (`trollout.scaleout`: a Ray run, or the shards of a Slurm array) is the sum
of its shard folders (`sharded_status`). RUN is then the run's output file, manifest or folder
(a Ray run), or its ``<stem>_shards`` folder (a Slurm array, whose merged output does not exist
until ``trollout aggregate``). Shards not started yet count as missing (and never started); when
no manifest says how many rollouts they hold (a Slurm array), ``expected`` counts only the
shards that started.

``not_started`` counts the missing rollouts of which no attempt ever started: no outcome row
but drained ones, and no attempt number in the ledger that may have reached a server (numbers
are reserved right before a request leaves). They are the rows a batch cut early, or a run
stopped before its end, never sent.

The document (`RunStatus.document`) is what ``trollout status --json`` prints; its keys are a
stable interface for machines, which is why it stays a mapping rather than a record.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import attrs

from ..errors import ConfigError, RunFolderLockedError
from ..health import verdict_counts
from ..metrics.exports import run_exports
from ..records import RunManifest
from ..recovery.layout import RunLayout
from ..recovery.lock import RunLock, read_owner
from ..recovery.manifest import locate_run, read_manifest
from ..recovery.resume import Fate, ResumeRules, RunTally, scan_run
from ..scaleout.layout import ShardFolder, shard_folders
from ..settings import default_max_attempts

__all__ = ["RunStatus", "locate_sharded", "run_status", "sharded_status", "status", "status_of"]


@attrs.frozen
class RunStatus:
    """Where a run stands.

    Attributes:
        layout: the run's folder (a distributed run's merged output).
        sharded: the run is distributed (its document sums its shards', under ``shards``).
        document: the status document (module docstring).
    """

    layout: RunLayout
    sharded: bool
    document: dict[str, Any]

    @property
    def complete(self) -> bool:
        """Every rollout landed."""
        return bool(self.document["complete"])

    @property
    def to_dispatch(self) -> int:
        """What a resume would dispatch."""
        return int(self.document["to_dispatch"])

    @property
    def retryable_remains(self) -> bool:
        """A resume would dispatch something."""
        return bool(self.document["retryable_remains"])


def status(
    run: str | os.PathLike[str],
    *,
    max_attempts: int | None = None,
    retry_terminal_timeouts: bool | None = None,
) -> RunStatus:
    """Return where RUN stands (its output file, manifest, folder, or shards folder). Read-only.

    Raises:
        ConfigError: RUN holds no run or several, or shards of several splits.
        RunFolderError: the materialized inputs are missing or a file is damaged mid-way.
    """
    sharded = locate_sharded(run)
    layout = sharded or locate_run(run)
    return status_of(
        layout,
        sharded=sharded is not None,
        max_attempts=max_attempts,
        retry_terminal_timeouts=retry_terminal_timeouts,
    )


def status_of(
    layout: RunLayout,
    *,
    sharded: bool,
    max_attempts: int | None = None,
    retry_terminal_timeouts: bool | None = None,
) -> RunStatus:
    """Return where the run in ``layout`` stands (`status`, once the run is located)."""
    of_run = sharded_status if sharded else run_status
    doc = of_run(layout, max_attempts=max_attempts, retry_terminal_timeouts=retry_terminal_timeouts)
    return RunStatus(layout, sharded, doc)


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
