"""The end of a Ray run, on the driver: completeness, the merge, rows in against rows out.

`finish` turns how the hand-outs ended (`handout.HandoutEnd`) into the run's `RunResult`. After
a run that was not stopped it checks ``require_complete``, merges the blocks into OUT and
aggregates them as one run (`metrics.aggregate_shards`, by the rollouts' identity across runs),
and counts what it can read before it says done: the blocks' folders as the driver sees them
must hold at least the rows the blocks reported landing in this invocation, and the merged OUT
every row landed in them; otherwise the run fails (exit 1) saying how many rows are where, so a
shards folder the driver does not share with the workers, or a merge that lost rows, is never
an empty OUT with exit 0.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import trio

from ...collector.deployment.discovery import Deployment
from ...errors import ConfigError, IncompleteEvaluationError, RunStoppedError
from ...metrics import AggregateOptions, AggregateResult, aggregate_shards
from ...recovery.layout import RunLayout
from ...run.compose import RunResult
from ...run.deployment import http_client
from ...run.observe import format_duration
from ...run.state import sharded_status
from ...settings import differences
from ..layout import shard_output
from .handout import HandoutEnd, RayRun, total_progress

__all__ = ["finish"]


async def finish(
    run: RayRun, deployment: Deployment, end: HandoutEnd, elapsed_s: float
) -> RunResult:
    if end.error is not None:
        message, usage = end.error
        raise (ConfigError if usage else RunStoppedError)(message)
    progress, _ = total_progress({}, end)
    interrupted = end.signal is not None or end.deadline_reached
    aggregate = None
    if not interrupted:
        await _check_complete(run)
        aggregate = await _merge(run, deployment)
        await _check_rows_out(run, end, aggregate)
    deaths = (
        f"; workers died {len(end.deaths)} times ({', '.join(end.deaths)})" if end.deaths else ""
    )
    timing = (
        f"ray: {run.blocks} blocks over {run.workers} workers, {end.handouts} hand-outs in "
        f"{format_duration(elapsed_s)}{deaths}"
    )
    return RunResult(
        layout=run.layout,
        expected=run.to_dispatch,
        progress=progress,
        elapsed_s=elapsed_s,
        max_resident=0,
        timing=timing,
        signal=end.signal,
        deadline_reached=end.deadline_reached,
        aggregate=aggregate,
        differences=tuple(differences(run.config)),
    )


async def _check_complete(run: RayRun) -> None:
    if not run.config.require_complete:
        return
    doc = await trio.to_thread.run_sync(
        partial(sharded_status, run.layout, max_attempts=run.config.max_attempts)
    )
    unfinished = doc["expected"] - doc["landed"]
    if unfinished:
        raise IncompleteEvaluationError(
            unfinished=unfinished, expected=doc["expected"], retryable=doc["retryable_remains"]
        )


async def _check_rows_out(run: RayRun, end: HandoutEnd, merged: AggregateResult | None) -> None:
    """Check that the driver reads every row the blocks landed, and OUT holds them all.

    Raises:
        RunStoppedError: it does not (the message says how many rows are where).
    """
    reported = sum(report.progress.landed for report in end.reports.values())
    doc = await trio.to_thread.run_sync(
        partial(sharded_status, run.layout, max_attempts=run.config.max_attempts)
    )
    shards = f"{run.layout.output.name.removesuffix('.jsonl')}_shards"
    where = str(run.layout.output.with_name(shards))
    if doc["landed"] < reported:
        raise RunStoppedError(
            f"the blocks landed {reported} rollouts, but the driver reads {doc['landed']} in "
            f"{where!r}: the workers wrote where this machine cannot read; the shards folder "
            "must be on a file system the driver and every worker share, at the same path "
            "(see the workers' logs for where they wrote)"
        )
    if merged is not None and merged.coverage.landed != doc["landed"]:
        raise RunStoppedError(
            f"the blocks in {where!r} hold {doc['landed']} landed rollouts, but the merged "
            f"{str(run.layout.output)!r} holds {merged.coverage.landed}; the block folders are "
            f"kept: merge them again with trollout aggregate '{where}/*/*.jsonl'"
        )


async def _merge(run: RayRun, deployment: Deployment) -> AggregateResult | None:
    """Merge the blocks into OUT and aggregate them as one run (unless disabled)."""
    if run.config.disable_aggregation:
        return None
    config = run.config
    options = AggregateOptions.of_run(config)
    shards = [shard_output(run.layout.output, b, run.blocks) for b in range(run.blocks)]
    targets = deployment.aggregate_metrics_targets()
    async with http_client(
        connect_timeout_s=config.connect_timeout_s, read_timeout_s=600.0
    ) as client:
        return await aggregate_shards(
            [s for s in shards if s.exists() and not _planned_nothing(s)],
            output=run.layout.output,
            options=options,
            targets=targets,
            client=client,
        )


def _planned_nothing(block_output: Path) -> bool:
    """Whether a block folder's plan is empty (hashing may give a block no task): it holds no
    row to merge, and aggregation refuses a shard that holds no row."""
    inputs = RunLayout.for_output(block_output).materialized_inputs
    try:
        return inputs.stat().st_size == 0
    except FileNotFoundError:
        return False  # not planned, or damaged: aggregation says which
