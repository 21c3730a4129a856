"""``trollout collect --ray [ADDRESS] --workers N``: one run on a Ray cluster (the driver).

The command line reaches this module lazily (`trollout.cli.scaleout.collect_any`); an embedding
driver may call `collect_on_ray` itself. It reports through a `trollout.run.RunObserver` like
`trollout.run.collect` does, and composes the run layer's pieces (`load_deployment`,
`sharded_status`, `http_client`), never the command line.

The driver (this module, in the ``trollout`` process) plans the whole input once (so bad input
is refused before anything is written), cuts the plan into B blocks and writes each block's run
folder, its rows and manifest (`rows`: no block reads or plans the input), then the run's
manifest beside OUT. It then hands blocks out to at most N workers at a time, the next block to
whichever worker frees up first, so a slow worker holds back only its own block and workers
added to the cluster mid-run (a pending task that finds room) get work (`handout`). Each block
is an ordinary run folder under ``<stem>_shards/`` (`block`), collected by the run layer
(`trollout.run.collect`); when every block is done they are merged and aggregated into OUT as
one run (`metrics.aggregate_shards`, by the rollouts' identity across runs).

The driver holds all the run's coordinating state (`handout`): the queue, every hand-out's
progress (streamed by the blocks), the stop level (a file in the shards folder). No actor or
other process of the run lives on a worker node, so losing any node loses only the hand-outs
running there. A worker that dies (killed, out of memory, its node lost) loses only its block's
hand-out: the block goes back to the front of the queue and the next worker resumes its folder,
the kernel having dropped the dead worker's lock; attempt numbers come from the folder's ledger,
so none is reused. A block stopped by a signal to its own worker (a node drain, a preemption) is
handed out again the same way, never merged as if done. A block lost 3 times
(`handout._MAX_CRASHES`) ends the run; what landed stays, resumable.

Ending early works as on one machine: the first SIGINT or SIGTERM, or ``--max-run-time``, stops
the hand-outs and asks every running block, through the run's stop file (`block.write_stop`), to
wind down (no new rollout; ``--grace`` for those in flight); a second SIGINT cancels them at
once. The run then exits 130, 143 or 1, resumable with ``trollout resume OUT``, which reads the
saved settings (B included, so the block folders are found again with any worker count).
``trollout status OUT`` sums the block folders (`trollout.run.status`).

The shards folder must be on a file system every worker and the driver share; the input file
must be readable at the same path on every node. The driver makes every file the settings name
absolute (`RunConfig.with_absolute_paths`: input, output and so the shards folder, prompt config,
batch manifest) before it plans or hands anything out: a worker runs in its Ray node's working
directory (``ray start`` was run somewhere else), where a relative ``-o`` would put the blocks
out of the driver's sight and a relative input would name no file.

Rows in, rows out: after a run that was not stopped, the driver counts what it can read before
it says done (`merge`). Telemetry, when asked for, is the driver's (`telemetry`): one trace,
the run's summed counts.

Design note: the rejected alternative gave each worker one static shard (``--shard i/N``, as the
Slurm array does). Then the slowest shard sets the finish time, a worker that joins late has
nothing to do, and a dead worker's shard waits for someone to notice. Each hand-out costs a task
start and its folder's resume (its own rows read and hashed), which is why there are only a few
blocks per worker (`_BLOCKS_PER_WORKER`). Rejected for the paths: making them absolute in each
block (the worker's working directory is not the driver's, so it cannot know what the user
meant) or changing the workers' working directory to the driver's (a node may not have that
directory, and Ray's ``runtime_env`` ``working_dir`` uploads a copy).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

import attrs
import ray
import trio

from ...collector.deployment.discovery import Deployment
from ...collector.planning.plan import Plan, plan_rollouts
from ...errors import (
    ConfigError,
    DeploymentError,
    RunFolderError,
)
from ...records import RunManifest
from ...recovery.layout import RunLayout
from ...recovery.lock import RunLock
from ...recovery.manifest import (
    ManifestCheck,
    build_manifest,
    check_manifest,
    read_manifest,
    write_manifest,
)
from ...recovery.preflight import check_run_folder, check_run_paths
from ...recovery.run_folder import input_sha256
from ...run.checks import check_free_space
from ...run.compose import RunResult, telemetry_missing
from ...run.deployment import load_deployment
from ...run.observe import RunObserver, StreamObserver
from ...run.state import sharded_status
from ...settings import RunConfig
from ...telemetry import TelemetrySettings, telemetry_settings
from ..layout import check_shards_root, shard_folders
from .handout import RayRun, drive
from .merge import finish
from .rows import write_blocks

if TYPE_CHECKING:
    from .telemetry import RayTelemetry

__all__ = ["collect_on_ray"]

_BLOCKS_PER_WORKER: Final = 4
# Workers' output stays in Ray's logs; Ray's own notes (start-up, token) are not ours to print.
_QUIET: Final[dict[str, Any]] = {"log_to_driver": False, "logging_level": logging.ERROR}


async def collect_on_ray(config: RunConfig, *, observer: RunObserver | None = None) -> RunResult:
    """Collect ``config``'s run on a Ray cluster: fresh, or resumed (module docstring).

    Raises:
        ConfigError: a bad address, or settings a Ray run cannot take.
        DeploymentError: the Ray cluster or the deployment cannot be reached.
        InputError: bad input rows (nothing written).
        RunFolderError: the run folder or a block folder refuses the run.
        RunChangedError: resuming a run whose input, plan settings or agent set changed.

    Cancellation: blocks in flight are asked to wind down; the folders stay resumable.
    """
    observer = observer or StreamObserver()
    config = config.with_absolute_paths()  # workers run elsewhere: see the module docstring
    if not config.output_jsonl_fpath:
        raise ConfigError("no output file: pass -o OUT.jsonl or +output_jsonl_fpath=<file.jsonl>")
    layout = RunLayout.for_output(config.output_jsonl_fpath)
    check_run_folder(layout, config, fresh=not config.resume_from_cache)
    check_shards_root(layout.output)
    watching = telemetry_settings(config)  # the driver's: blocks export only their spans
    started = _connect(config)  # on this thread: Ray sets its signal handlers only there
    try:
        deployment = await load_deployment(config)
        begun = trio.current_time()
        config = _with_workers(config)
        fresh = await _fresh_plan(layout, config, deployment)  # nothing is written before it
        layout.output.parent.mkdir(parents=True, exist_ok=True)
        with RunLock.for_layout(layout):  # held through the merge: OUT is this run's to write
            run = await (_start(*fresh) if fresh else _resume(layout, config, deployment))
            async with _telemetry(watching, run, observer) as telemetry:
                end = await drive(run, deployment, observer, telemetry)
                if telemetry is not None:
                    telemetry.finish(end)
                return await finish(run, deployment, end, trio.current_time() - begun)
    finally:
        if started:
            await trio.to_thread.run_sync(ray.shutdown)


@asynccontextmanager
async def _telemetry(
    settings: TelemetrySettings | None, run: RayRun, observer: RunObserver
) -> AsyncIterator[RayTelemetry | None]:
    """Open the run's telemetry when asked for (OpenTelemetry is imported only then)."""
    if settings is None:
        yield None
        return
    try:
        from .telemetry import open_ray_telemetry
    except ImportError as exc:
        raise telemetry_missing(exc) from exc
    async with open_ray_telemetry(settings, run, observer) as telemetry:
        yield telemetry


# --- the cluster --------------------------------------------------------------------------------


def _connect(config: RunConfig) -> bool:
    """Join (or start) the Ray cluster; return whether this call started a local one.

    ``--ray`` alone joins ``RAY_ADDRESS`` when it is set, as ``ray.init()`` does: a driver
    started by ``ray job submit`` runs with it set to the job's cluster.
    """
    address = config.ray_address
    if address in (None, "local") and os.environ.get("RAY_ADDRESS"):
        address = "auto"
    if address not in (None, "local", "auto"):
        check_reachable(address)
    if ray.is_initialized():  # an embedding driver's, or a test's, cluster
        return False
    try:
        if address in (None, "local"):
            cpus = max(config.ray_workers or 0, os.cpu_count() or 1)
            ray.init(**_QUIET, num_cpus=cpus, include_dashboard=False)
            return True
        ray.init(**_QUIET, address=address)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise DeploymentError(
            f"cannot join the Ray cluster at {address!r} ({exc}); check the address, or "
            "drop it (--ray alone) for a cluster of this machine's own"
        ) from exc
    return False


def check_reachable(address: str) -> None:
    """Refuse a Ray address that is malformed or where nothing listens (a quick TCP check).

    Raises:
        ConfigError: the address is not ``host:port`` or ``ray://host:port``.
        DeploymentError: nothing answers there.
    """
    parts = urlsplit(address if "://" in address else f"gcs://{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if parts.scheme not in ("gcs", "ray") or not host or port is None:
        raise ConfigError(
            f"--ray {address!r} is not a Ray address; give host:port (the head's GCS), "
            "ray://host:port (Ray Client) or auto, or --ray alone for a local cluster "
            "(then put it after INPUT, so INPUT is not read as the address)"
        )
    try:
        socket.create_connection((host, port), timeout=5.0).close()
    except OSError as exc:
        raise DeploymentError(
            f"cannot reach the Ray cluster at {address!r} ({exc.strerror or exc}); start it "
            "(ray start --head), check the address, or give --ray alone for a local cluster"
        ) from None


# --- before the first block ---------------------------------------------------------------------


def _with_workers(config: RunConfig) -> RunConfig:
    """Fix N: ``--workers``, else one per CPU of the cluster."""
    if config.ray_workers is not None:
        return config
    cpus = int(ray.cluster_resources().get("CPU", 1))  # type: ignore[no-untyped-call]
    return attrs.evolve(config, ray_workers=max(cpus, 1))


_Fresh = tuple[RunLayout, RunConfig, Deployment, Plan]


async def _fresh_plan(
    layout: RunLayout, config: RunConfig, deployment: Deployment
) -> _Fresh | None:
    """Plan a run that starts now (None: a resume of a run that has a manifest)."""
    if config.resume_from_cache and layout.manifest.exists():
        return None
    if any(f.layout.materialized_inputs.exists() for f in shard_folders(layout.output)):
        if config.resume_from_cache:
            raise RunFolderError(
                f"cannot resume {str(layout.output)!r}: its shards are there but its manifest "
                f"({layout.manifest.name}) is not; restore it, or collect into a new output file"
            )
        check_fresh_shards(layout, overwrite=config.overwrite)
    if not config.input_jsonl_fpath:
        raise ConfigError("no input file: pass INPUT or +input_jsonl_fpath=<file.jsonl>")
    plan = await trio.to_thread.run_sync(
        plan_rollouts, config.input_jsonl_fpath, config, deployment
    )
    return layout, config, deployment, plan


def check_fresh_shards(layout: RunLayout, *, overwrite: bool) -> None:
    """Refuse a fresh run over shards of an earlier one, unless ``overwrite``."""
    if not overwrite:
        raise RunFolderError(
            f"{str(layout.output)!r} already holds the shards of a run "
            f"({layout.output.name.removesuffix('.jsonl')}_shards); pass --resume to continue "
            "it, or --overwrite to delete it and start afresh"
        )


async def _start(
    layout: RunLayout, config: RunConfig, deployment: Deployment, plan: Plan
) -> RayRun:
    """Write the blocks' folders (`rows.write_blocks`), then the run's manifest (its commit
    marker); on overwrite, clear the old run first."""
    assert config.ray_workers is not None
    blocks = config.ray_blocks or max(1, min(plan.tasks, _BLOCKS_PER_WORKER * config.ray_workers))
    config = attrs.evolve(config, ray_blocks=blocks)
    digest = await _digest(config)
    manifest = build_manifest(
        config, deployment, input_sha256=digest or "", expected=plan.expected, tasks=plan.tasks
    )
    check_free_space(layout, plan)
    write = partial(write_blocks, config, layout.output, plan, deployment)
    await trio.to_thread.run_sync(_write_start, layout, manifest, config.overwrite, write)
    return RayRun(layout, config, plan.expected, plan.expected, run_id=manifest.run_id)


async def _resume(layout: RunLayout, config: RunConfig, deployment: Deployment) -> RayRun:
    """Check a run's manifest against now; take its blocks (B never changes)."""
    manifest = read_manifest(layout)
    assert manifest is not None
    saved_blocks = manifest.settings.get("ray_blocks")
    if not isinstance(saved_blocks, int):
        raise RunFolderError(
            f"{str(layout.output)!r} was not collected on Ray; resume it without --ray "
            "(trollout resume RUN)"
        )
    current = ManifestCheck.of(config, deployment, input_sha256=await _digest(config))
    check_manifest(layout, manifest, current, allow_unsafe=config.allow_unsafe_resume)
    config = attrs.evolve(config, ray_blocks=saved_blocks)
    doc = await trio.to_thread.run_sync(
        partial(sharded_status, layout, max_attempts=config.max_attempts)
    )
    to_dispatch = doc["to_dispatch"]
    return RayRun(layout, config, manifest.expected_rollouts, to_dispatch, manifest.run_id, False)


async def _digest(config: RunConfig) -> str | None:
    path = config.input_jsonl_fpath
    if not path or not await trio.Path(path).exists():
        return None
    return await input_sha256(path)


def _write_start(
    layout: RunLayout, manifest: RunManifest, overwrite: bool, write_blocks: Callable[[], object]
) -> None:
    """On ``overwrite``, clear the old run's files (ours only: its manifest first); write the
    blocks' folders, then the manifest. Interrupted before the manifest, the blocks are
    refused as a run's until --overwrite (`check_fresh_shards`)."""
    check_run_paths(layout)
    layout.output.parent.mkdir(parents=True, exist_ok=True)
    if overwrite:
        for folder in [layout, *(f.layout for f in shard_folders(layout.output))]:
            check_run_paths(folder)  # regular files only: never a link's target
            folder.manifest.unlink(missing_ok=True)
            for path in folder.all_files():
                path.unlink(missing_ok=True)
    write_blocks()
    write_manifest(layout, manifest)
    layout.output.touch()
