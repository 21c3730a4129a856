"""One eval on many machines from the command line: ``--shard``, ``--ray``, ``trollout sbatch``.

- ``collect --shard I/N``: shard I of the plan, a setting like ``limit`` (`RunConfig.shard`).
- ``collect --ray [ADDRESS] --workers N`` (and ``resume`` of such a run): `collect_any` sends
  the run to `trollout.scaleout.ray.driver`, imported only then, so the plain command line never
  imports Ray; everything else goes to the run layer (`session.collect_run`).
- ``trollout sbatch``: writes the Slurm array script (`sbatch`, the command of its own).

A folder a Ray run made is resumed on Ray: a plain ``collect --resume`` into it is refused,
since its attempt ledgers live in the block folders and one process writing OUT directly could
reuse their attempt numbers.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from ..errors import ConfigError, TrolloutError
from ..recovery.layout import RunLayout
from ..recovery.manifest import read_manifest
from ..recovery.resume import Resubmit
from ..run.compose import RunResult
from ..settings import RunConfig
from .progress import ConsoleObserver

__all__ = ["collect_any", "ray_options", "scaleout_options"]

F = TypeVar("F", bound=Callable[..., Any])
# Set before Ray is first imported: a cluster of this machine's own then binds loopback only.
_LOCAL_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def ray_options(f: F) -> F:
    """Attach ``--ray [ADDRESS]`` and ``--workers N``."""
    f = click.option(
        "--workers",
        "ray_workers",
        type=int,
        help="With --ray: blocks collected at once, one per worker (default: the cluster's CPUs).",
    )(f)
    return click.option(
        "--ray",
        "ray_address",
        is_flag=False,
        flag_value="local",
        metavar="[ADDRESS]",
        help="Run on a Ray cluster: ADDRESS (host:port, ray://host:port, auto), or a cluster "
        "of this machine's own when none is given (pip install 'trollout[ray]').",
    )(f)


def scaleout_options(f: F) -> F:
    """Attach ``--shard I/N`` and the Ray options (collect)."""
    f = ray_options(f)
    return click.option(
        "--shard",
        metavar="I/N",
        help="Collect only shard I of N (0 <= I < N) of the plan: the tasks whose content "
        "hashes to it, numbered and seeded as one machine would; merge with trollout aggregate.",
    )(f)


async def collect_any(
    config: RunConfig, live: bool | None, resubmit: Resubmit | None = None
) -> RunResult:
    """Collect on Ray when the settings say so, else in this process (`collect_run`).

    Raises:
        ConfigError: Ray settings that do not go together, or Ray is not installed.
        TrolloutError: whatever the chosen path raises.

    Cancellation: as `collect_run`.
    """
    if config.ray_address is None and config.ray_workers is None:
        from .session import collect_run

        _refuse_ray_folder(config)
        return await collect_run(config, live=live, resubmit=resubmit)
    _check_ray_settings(config, resubmit)
    if config.ray_address in (None, "local") and not os.environ.get("RAY_ADDRESS"):
        os.environ.setdefault(_LOCAL_ONLY, "0")  # not under ray job submit: that joins a cluster
    try:
        from ..scaleout.ray import driver
    except ImportError as exc:
        if exc.name != "ray" and not str(exc.name).startswith("ray."):
            raise
        raise ConfigError(
            "--ray needs Ray, which is not installed; pip install 'trollout[ray]'"
        ) from None
    return await driver.collect_on_ray(config, observer=ConsoleObserver(None, live))


def _check_ray_settings(config: RunConfig, resubmit: Resubmit | None) -> None:
    if config.ray_address is None:
        raise ConfigError(
            f"--workers {config.ray_workers!r} needs --ray: workers are Ray workers; add --ray "
            "(a cluster of this machine's own) or --ray ADDRESS"
        )
    if config.shard is not None:
        raise ConfigError(
            f"--shard {config.shard!r} and --ray do not go together: a Ray run cuts the plan "
            "into blocks itself; drop --shard"
        )
    if config.metrics_port is not None:
        raise ConfigError(
            f"--metrics-port {config.metrics_port!r} and --ray do not go together: a Ray run's "
            "blocks share hosts, where one port cannot serve them all, so no Prometheus "
            "endpoint would be served; send metrics over OTLP (--otlp-endpoint) instead"
        )
    if resubmit is not None or config.resubmit:
        raise ConfigError("resubmit is not supported on Ray yet; resubmit each block folder")


def _refuse_ray_folder(config: RunConfig) -> None:
    if not (config.resume_from_cache and config.output_jsonl_fpath):
        return
    try:
        manifest = read_manifest(RunLayout.for_output(config.output_jsonl_fpath))
    except TrolloutError:
        return  # the resume itself reports a damaged manifest
    if manifest is not None and isinstance(manifest.settings.get("ray_blocks"), int):
        raise ConfigError(
            f"{config.output_jsonl_fpath!r} is a run collected on Ray; resume it there: "
            f"trollout resume {config.output_jsonl_fpath}, or add --ray"
        )
