"""The checks of a run, and the steps around the engine that read or score its folder.

Before a write (`check_before_writing`, `plan`, `check_free_space`, `check_batch_manifest`;
`check_shard_jobs` for every job of a run cut into shards, before its script is written):
everything that can refuse the run is checked before a single file is touched, so a refusal
leaves the folder as it was (docs/design.md, Durability). After the engine (`check_complete`,
`aggregate`, `batch_status_not_aggregated`): what ``require_complete`` refuses, the metrics,
and the batch status of a run that was not scored.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import attrs
import trio

from ..collector.deployment.discovery import Deployment
from ..collector.planning.input_file import FileSource
from ..collector.planning.plan import Plan, plan_rollouts
from ..errors import ConfigError, IncompleteEvaluationError, RunFolderError
from ..metrics import AggregateOptions, AggregateResult, aggregate_run
from ..metrics.batch import check_members, read_batch_manifest, write_batch_status
from ..metrics.reader import Collection
from ..recovery.files import format_bytes
from ..recovery.layout import RunLayout
from ..recovery.manifest import FolderState, folder_state
from ..recovery.preflight import check_input, check_run_paths
from ..recovery.resume import Fate, ResumeRules, scan_run
from ..recovery.store import check_run_folder
from ..scaleout.layout import check_shards_root, shard_output
from ..settings import RunConfig, materialized_problem
from ..telemetry import TelemetrySettings, telemetry_settings
from .deployment import http_client

__all__ = [
    "aggregate",
    "batch_status_not_aggregated",
    "check_batch_manifest",
    "check_before_writing",
    "check_complete",
    "check_free_space",
    "check_shard_jobs",
    "plan",
]


def check_before_writing(
    config: RunConfig, *, resuming: bool, prometheus: bool = True
) -> tuple[RunLayout, TelemetrySettings | None]:
    """Run every check of a collection run that needs neither the deployment nor a write.

    `collect` runs it first; ``trollout sbatch`` runs it for every shard its jobs will
    collect, so a script is never written for a run whose jobs would all refuse it. Read-only.

    Returns:
        The run folder, and where its telemetry goes (None: nowhere).

    Raises:
        ConfigError: no input or output path given, or a bad ``OTEL_*`` value.
        InputError: the input is missing, unreadable or not a regular file (when it will be
            planned: a fresh run, or a resume of a folder holding no run yet).
        RunFolderError: the folder's preflight checks (`recovery.preflight`).
    """
    if not config.output_jsonl_fpath:
        raise ConfigError("no output file: pass -o OUT.jsonl or +output_jsonl_fpath=<file.jsonl>")
    if not config.input_jsonl_fpath and not resuming:
        raise ConfigError("no input file: pass INPUT or +input_jsonl_fpath=<file.jsonl>")
    layout = RunLayout.for_output(config.output_jsonl_fpath, config.materialized_jsonl_fpath)
    check_run_folder(layout, config, fresh=not resuming)  # before slow work; the store rechecks
    if config.input_jsonl_fpath and (not resuming or folder_state(layout) is FolderState.NEW):
        FileSource(config.input_jsonl_fpath).check_readable()  # before the deployment is asked
    # A bad OTEL_* value is refused before any write.
    return layout, telemetry_settings(config, prometheus=prometheus)


def check_shard_jobs(config: RunConfig, output: Path, shards: int) -> TelemetrySettings | None:
    """Run collect's own checks for every job of a run cut into ``shards``, and the merge's on
    OUT (read-only); return where the jobs' telemetry goes.

    Each job is ``collect --shard I/N --resume`` into its shard folder (a Slurm array's), so
    each shard gets exactly the checks that command runs before it asks the deployment anything
    (`check_before_writing`); the deployment and the rows' routing are checked by the jobs,
    since the head server may be reachable from the compute nodes only. ``trollout aggregate``
    later writes OUT's run files, so they get the run folder's path checks too.
    """
    check_shards_root(output)
    merged = RunLayout.for_output(output)
    check_run_paths(merged)
    check_input(merged, config.input_jsonl_fpath)
    watching = None
    for index in range(shards):
        job = attrs.evolve(
            config,
            output_jsonl_fpath=str(shard_output(output, index, shards)),
            shard=f"{index}/{shards}",
            resume_from_cache=True,
        )
        if problem := materialized_problem(job.materialized_jsonl_fpath, job):
            raise ConfigError(problem)
        _, watching = check_before_writing(job, resuming=True)
    return watching


def plan(config: RunConfig, deployment: Deployment) -> Plan:
    """Plan the run's input (every bad row refused here, before a file is touched)."""
    if not config.input_jsonl_fpath:
        raise ConfigError("no input file: pass INPUT or +input_jsonl_fpath=<file.jsonl>")
    return plan_rollouts(config.input_jsonl_fpath, config, deployment)


def check_batch_manifest(config: RunConfig, plan: Plan) -> None:
    """Refuse a plan that does not match its batch manifest's members (before any write)."""
    if not config.batch_manifest_fpath:
        return
    members = read_batch_manifest(config.batch_manifest_fpath)
    tasks: dict[str, set[int]] = {}
    rollouts: Counter[str] = Counter()
    for row in plan.rows():
        agent = row.identity.agent_name or row.identity.environment_server or ""
        tasks.setdefault(agent, set()).add(row.identity.task_index)
        rollouts[agent] += 1
    check_members(members, {agent: (len(t), rollouts[agent]) for agent, t in tasks.items()})


def check_free_space(layout: RunLayout, plan: Plan) -> None:
    """Refuse a plan whose materialized inputs alone would not fit on the output's disk."""
    folder = layout.output.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if plan.materialized_bytes > free:
        raise RunFolderError(
            f"the plan's {plan.expected:,} rollouts need about "
            f"{format_bytes(plan.materialized_bytes)} of materialized inputs, but "
            f"{str(folder)!r} has {format_bytes(free)} free; free space, or plan fewer "
            "rollouts (--limit, --num-repeats)"
        )


def batch_status_not_aggregated(layout: RunLayout, config: RunConfig) -> None:
    """Write the batch status of a run whose metrics were not computed (blocking)."""
    assert config.batch_manifest_fpath is not None
    collection = Collection(None)
    collection.read([layout.output])
    collection.resolve(count_missing=False)
    write_batch_status(
        config.batch_manifest_fpath,
        read_batch_manifest(config.batch_manifest_fpath),
        collection,
        aggregation="not_run",
        cap=config.max_attempts,
        retry_timeouts=config.retry_terminal_timeouts,
    )


async def check_complete(layout: RunLayout, config: RunConfig) -> None:
    """Under ``require_complete``, refuse a run that left unfinished work (before any score)."""
    if not config.require_complete:
        return
    rules = ResumeRules(
        max_attempts=config.max_attempts, retry_terminal_timeouts=config.retry_terminal_timeouts
    )
    tally = (await trio.to_thread.run_sync(scan_run, layout, rules)).tally
    unfinished = tally.expected - tally.count(Fate.LANDED)
    if unfinished:
        raise IncompleteEvaluationError(
            unfinished=unfinished, expected=tally.expected, retryable=tally.retryable_remains
        )


async def aggregate(
    layout: RunLayout, config: RunConfig, deployment: Deployment
) -> AggregateResult | None:
    """Compute local and server metrics of the run (skipped with ``disable_aggregation``)."""
    if config.disable_aggregation:
        return None
    options = AggregateOptions.of_run(config)
    targets = deployment.aggregate_metrics_targets()
    timeouts = {"connect_timeout_s": config.connect_timeout_s, "read_timeout_s": 600.0}
    async with http_client(**timeouts) as client:
        return await aggregate_run(layout, options=options, targets=targets, client=client)
