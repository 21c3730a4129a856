"""Aggregate a run, or merge shards and aggregate them: the public entry points.

`aggregate_shards` is ``trollout aggregate``; `aggregate_run` is what ``collect`` calls at the end
of a run (unless ``disable_aggregation``). Both:

1. read the shards once, streaming (`reader.Collection`), writing the merged run folder when
   asked (``-o``), in a worker thread so the Trio loop stays responsive;
2. settle every rollout and add the configured imputed zeros (`coverage`);
3. summarize each group locally (`summary`): coverage, both views, NeMo Gym's default metrics;
4. when targets are given, call ``/aggregate_metrics`` once per agent or environment server
   (`server`); a failed call is recorded, not raised;
5. write ``<stem>_aggregate_metrics.json`` and ``<stem>_report.html`` beside the output, then
   rename the merged files into place;
6. mark each shard's status file with the aggregation's outcome (`shards.refresh_shard_status`),
   and write the batch status beside a batch manifest.

Every check comes before the first write: no written file is a file read or written otherwise
(`shards.refuse_overlaps`), the merged output replaces only files trollout wrote unless
``overwrite`` (`shards.refuse_foreign`), and the shards whose status file cannot be marked are
found (`shards.shard_statuses`): each is skipped with a warning (`AggregateResult.warnings`).
Nothing is renamed into place before step 5, so a cancelled aggregation leaves no half-written
file.

Design note: reading a million rows takes most of a minute of CPU. Running it on the Trio
thread (rejected) would freeze everything else the caller's loop does meanwhile: ``collect``'s
signal handling and progress display. A worker thread keeps the loop live; the cost is that the
read cannot be abandoned halfway, which is harmless because it writes only temporary files.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs
import httpx
import trio
from attrs import frozen

from ..errors import ConfigError, RunFolderError, RunFolderLockedError
from ..recovery.layout import RunLayout
from ..recovery.lock import RunLock
from ..settings import DEFAULT_MAX_INPUT_LINE_BYTES, RunConfig, default_max_attempts
from .batch import read_batch_manifest, status_path, write_batch_status
from .coverage import GroupKey
from .output import metrics_entries, write_metrics_file
from .reader import Collection
from .report_html import write_report
from .result import AggregateResult
from .server import Target, fetch_server_metrics, target_for
from .shards import (
    MergeWriter,
    Role,
    refresh_shard_status,
    refuse_foreign,
    refuse_overlaps,
    shard_statuses,
)
from .summary import GroupSummary, SummaryOptions, summarize

__all__ = ["AggregateOptions", "AggregateResult", "aggregate_run", "aggregate_shards"]


@frozen(kw_only=True)
class AggregateOptions:
    """What goes into the metric input, and how intervals are computed.

    Attributes:
        count_failure_classes_as_zero: failure classes whose latest row counts as reward 0
            (a row its producer marked ``_ng_failure_counts_as_zero`` always does).
        count_missing_rollouts_as_zero: planned rollouts with no row count as reward 0.
        bootstrap_samples: resamples per interval (0: normal approximation only).
        confidence: interval coverage.
        seed: the bootstrap seed; the same seed gives the same intervals.
        max_bootstrap_categories: above this many distinct task outcomes, intervals use the
            normal approximation (see `estimators`).
        write_report: write ``<stem>_report.html``.
        max_attempts: the attempt cap rollouts without a recorded cap are held to (the
            ``retries/*`` exports); default: env ``NEMO_GYM_MAX_ROLLOUT_ATTEMPTS``, else 3.
        batch_manifest: a NeMo Gym batch manifest: ``batch_status.json`` is written beside it.
        retry_terminal_timeouts: judge terminal timeouts retryable in that batch status.
        max_line_bytes: the longest line read from a shard (the input line limit,
            ``--max-line-bytes``); None for a run's own aggregation of the files it wrote.
    """

    count_failure_classes_as_zero: frozenset[str] | None = None
    count_missing_rollouts_as_zero: bool = False
    bootstrap_samples: int = 1000
    confidence: float = 0.95
    seed: int = 0
    max_bootstrap_categories: int = 2000
    write_report: bool = True
    max_attempts: int = attrs.field(factory=default_max_attempts)
    batch_manifest: Path | None = None
    retry_terminal_timeouts: bool = False
    max_line_bytes: int | None = DEFAULT_MAX_INPUT_LINE_BYTES

    @classmethod
    def of_run(cls, config: RunConfig) -> AggregateOptions:
        """The options a collection run's own aggregation uses (collect, resume, Ray)."""
        classes = config.count_failure_classes_as_zero
        manifest = config.batch_manifest_fpath
        return cls(
            count_failure_classes_as_zero=None if classes is None else frozenset(classes),
            count_missing_rollouts_as_zero=config.count_missing_rollouts_as_zero,
            seed=config.seed,
            max_attempts=config.max_attempts,
            batch_manifest=Path(manifest) if manifest else None,
            retry_terminal_timeouts=config.retry_terminal_timeouts,
            max_line_bytes=None,  # the files this run wrote itself (rows hold whole replies)
        )

    def summary_options(self) -> SummaryOptions:
        """Return the interval settings."""
        return SummaryOptions(
            bootstrap_samples=self.bootstrap_samples,
            confidence=self.confidence,
            seed=self.seed,
            max_bootstrap_categories=self.max_bootstrap_categories,
            max_attempts=self.max_attempts,
        )


async def aggregate_run(
    layout: RunLayout,
    *,
    options: AggregateOptions | None = None,
    targets: Sequence[Target] | None = None,
    client: httpx.AsyncClient | None = None,
) -> AggregateResult:
    """Aggregate one run folder in place (what ``collect`` does at the end of a run).

    Cancellation: see `aggregate_shards`.
    """
    return await aggregate_shards([layout.output], options=options, targets=targets, client=client)


async def aggregate_shards(
    shards: Sequence[Path],
    *,
    output: Path | None = None,
    options: AggregateOptions | None = None,
    targets: Sequence[Target] | None = None,
    client: httpx.AsyncClient | None = None,
    merge_shards: bool = True,
    plan: Path | None = None,
    overwrite: bool = False,
) -> AggregateResult:
    """Merge shards into ``output`` (when given) and write their metrics and report.

    Args:
        shards: rollouts files (see `shards.resolve_inputs`), read in the order given.
        output: the merged rollouts file; required for several shards. Without it the metrics
            are written beside the single shard.
        options: the metric input and intervals.
        targets: ``(agent, environment server, base URL)`` for ``/aggregate_metrics``; None or
            empty aggregates locally only.
        client: the HTTP client for the calls (one is opened when targets need it).
        merge_shards: write the merged run folder at ``output`` (False: only the metrics and
            report go beside it, as NeMo Gym's ``merge_shards=false``).
        plan: NeMo Gym's ``materialized_inputs_jsonl_fpath``: its rollouts are expected; it
            numbers shards by task index when no shard has materialized inputs of its own,
            else it is a union of runs' plans (`reader`).
        overwrite: replace files at ``output`` that trollout did not write (never a link, nor
            anything but a regular file).

    Raises:
        ConfigError: several shards without ``output``; a file written that is read or written
            otherwise (an input, the plan, the batch manifest); a file at ``output`` trollout
            did not write, without ``overwrite``.
        InputError: a line of a shard is not a JSON object or lacks the identity stamps.

    Cancellation: reading and writing run in worker threads that finish before a cancellation
    is delivered; a cancellation during the server calls discards the merged files. Nothing is
    written until every step succeeded, so a retry is safe.
    """
    options = options or AggregateOptions()
    layout = _output_layout(shards, output if merge_shards else output or _single(shards))
    merged = output is not None and merge_shards
    written = _written(layout, merged=merged, report=options.write_report)
    statuses, warnings = await trio.to_thread.run_sync(
        _check, shards, written, options.batch_manifest, plan
    )
    if output is not None:
        await trio.to_thread.run_sync(
            functools.partial(refuse_foreign, layout, written, overwrite=overwrite)
        )
    members = None
    if options.batch_manifest is not None:
        members = await trio.to_thread.run_sync(read_batch_manifest, options.batch_manifest)
    merge = MergeWriter(layout) if merged else None
    # The output folder's lock, while it is free: a writer killed holding it leaves its record,
    # which sends the folder's next run to remove the temp files left (`recovery.lock`). A live
    # collector's folder is aggregated as before, without it.
    lock = await trio.to_thread.run_sync(_lock_if_free, layout)
    try:
        collection, summaries = await trio.to_thread.run_sync(
            _compute, shards, merge, options, bool(targets), plan
        )
        if targets:
            summaries = await _with_servers(summaries, collection, targets, client)
        result = await trio.to_thread.run_sync(
            _write, layout, merge, summaries, collection, options
        )
    except BaseException:
        if merge is not None:
            merge.discard()
        raise
    finally:
        if lock is not None:
            lock.release()  # before the shards' statuses are marked, each under its lock
    warnings += await trio.to_thread.run_sync(
        refresh_shard_status, statuses, result.metrics_path, result.server_errors
    )
    result = attrs.evolve(result, warnings=tuple(warnings))
    if members is not None and options.batch_manifest is not None:
        await trio.to_thread.run_sync(
            functools.partial(
                write_batch_status,
                options.batch_manifest,
                members,
                collection,
                aggregation="ok" if result.ok else "error",
                cap=options.max_attempts,
                retry_timeouts=options.retry_terminal_timeouts,
            )
        )
    return result


def _single(shards: Sequence[Path]) -> Path | None:
    return shards[0] if len(shards) == 1 else None


def _output_layout(shards: Sequence[Path], output: Path | None) -> RunLayout:
    if output is not None:
        return RunLayout.for_output(output)
    if len(shards) != 1:
        raise ConfigError(
            f"{len(shards)} shards need a merged output file; pass -o merged.jsonl "
            "(or +output_jsonl_fpath=merged.jsonl)"
        )
    return RunLayout.for_output(shards[0])


def _written(layout: RunLayout, *, merged: bool, report: bool) -> list[Path]:
    paths = [layout.aggregate_metrics] + ([layout.report] if report else [])
    if merged:
        paths += [layout.rollouts, layout.failures, layout.materialized_inputs]
    return paths


def _check(
    shards: Sequence[Path], written: Sequence[Path], manifest: Path | None, plan: Path | None
) -> tuple[list[RunLayout], list[str]]:
    """Refuse overlapping files; return the shards whose status may be marked, and warnings."""
    statuses, warnings = shard_statuses(shards)
    layouts = [RunLayout.for_output(p) for p in shards]
    read: list[Role] = [
        ("one of the input files", p)
        for lay in layouts
        for p in (lay.rollouts, lay.failures, lay.materialized_inputs)
    ]
    read += [("the plan (materialized_inputs_jsonl_fpath)", plan)] if plan else []
    read += [("the batch manifest", manifest)] if manifest else []
    writes: list[Role] = [("output", p) for p in written]
    writes += [("the batch status", status_path(manifest))] if manifest else []
    writes += [("a shard's status file", lay.batch_status) for lay in statuses]
    refuse_overlaps(writes, read)
    return statuses, warnings


def _compute(
    shards: Sequence[Path],
    merge: MergeWriter | None,
    options: AggregateOptions,
    keep_rows: bool,
    plan: Path | None,
) -> tuple[Collection, list[GroupSummary]]:
    if plan is not None and not plan.is_file():
        raise ConfigError(f"materialized inputs {str(plan)!r} is not a file; check the path")
    collection = Collection(
        options.count_failure_classes_as_zero,
        keep_rows=keep_rows,
        max_line_bytes=options.max_line_bytes,
    )
    if merge is None:
        collection.read(shards, plan=plan)
    else:
        with merge:
            collection.read(shards, merge, plan=plan)
    collection.resolve(count_missing=options.count_missing_rollouts_as_zero)
    return collection, summarize(collection, options.summary_options())


async def _with_servers(
    summaries: list[GroupSummary],
    collection: Collection,
    targets: Sequence[Target],
    client: httpx.AsyncClient | None,
) -> list[GroupSummary]:
    if client is None:
        async with httpx.AsyncClient() as own:
            return await _with_servers(summaries, collection, targets, own)
    rows: Mapping[GroupKey, list[tuple[int, int, bytes]]] = collection.server_rows or {}
    out = []
    for summary in summaries:
        target = target_for(summary.key, summary.environment_server, targets)
        if target is not None:
            outcome = await fetch_server_metrics(client, target[2], rows.get(summary.key, []))
            summary = attrs.evolve(summary, server=outcome)
        out.append(summary)
    return out


def _write(
    layout: RunLayout,
    merge: MergeWriter | None,
    summaries: list[GroupSummary],
    collection: Collection,
    options: AggregateOptions,
) -> AggregateResult:
    layout.output.parent.mkdir(parents=True, exist_ok=True)  # merge_shards=false makes none
    # The metrics file first: it marks the output as trollout's (`shards.refuse_foreign`), so
    # an aggregation killed before the merged files are renamed into place may be run again.
    write_metrics_file(layout.aggregate_metrics, metrics_entries(summaries, collection))
    result = AggregateResult(
        tuple(summaries),
        collection.report,
        layout.aggregate_metrics,
        merged_path=layout.rollouts if merge is not None else None,
    )
    if options.write_report:
        write_report(layout.report, result)
        result = attrs.evolve(result, report_path=layout.report)
    if merge is not None:
        merge.commit()
    return result


def _lock_if_free(layout: RunLayout) -> RunLock | None:
    """Take the lock of the folder aggregation writes into, or None when a collector holds it
    (or the folder cannot be locked: writing there reports the problem)."""
    lock = RunLock.for_layout(layout)
    try:
        lock.acquire()
    except (RunFolderLockedError, RunFolderError):
        return None
    return lock
