"""One eval on many machines from the command line: ``--shard``, ``--ray``, ``trollout sbatch``.

- ``collect --shard I/N``: shard I of the plan, a setting like ``limit`` (`RunConfig.shard`).
- ``collect --ray [ADDRESS] --workers N`` (and ``resume`` of such a run): `collect_any` sends
  the run to `ray_run`, imported only then, so the plain command line never imports Ray.
- ``trollout sbatch``: writes the Slurm array script (`scaleout.sbatch`).

A folder a Ray run made is resumed on Ray: a plain ``collect --resume`` into it is refused,
since its attempt ledgers live in the block folders and one process writing OUT directly could
reuse their attempt numbers.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ..config import RunConfig
from ..errors import ConfigError, TrolloutError
from ..recovery.layout import RunLayout
from ..recovery.manifest import read_manifest
from ..recovery.resume import Resubmit
from ..scaleout.sbatch import sbatch_script
from ..telemetry import telemetry_settings
from .common import build_run_config, fail

if TYPE_CHECKING:  # collect imports this module for its options
    from .collect import RunResult

__all__ = ["collect_any", "ray_options", "sbatch", "scaleout_options"]

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
        from .collect import collect_run

        _refuse_ray_folder(config)
        return await collect_run(config, live=live, resubmit=resubmit)
    _check_ray_settings(config, resubmit)
    if config.ray_address in (None, "local"):
        os.environ.setdefault(_LOCAL_ONLY, "0")
    try:
        from . import ray_run
    except ImportError as exc:
        if exc.name != "ray" and not str(exc.name).startswith("ray."):
            raise
        raise ConfigError(
            "--ray needs Ray, which is not installed; pip install 'trollout[ray]'"
        ) from None
    return await ray_run.collect_on_ray(config, live=live)


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


_SBATCH_HELP = """Write a Slurm array script that collects a run as N shards.

ARGS are collect's: INPUT -o OUT and any options or +key=value settings. Job I of the array
runs `trollout collect ARGS --shard I/N --resume` into OUT's shards folder; a job stopped at
its time limit leaves a resumable shard, and submitting the script again (or `sbatch
--array=3,5 SCRIPT`) resumes it. When the jobs are done, `trollout aggregate` (its command is
in the script) merges the shards into OUT as one run.

Array jobs may share a node, so a fixed Prometheus port (--metrics-port N, or
OTEL_METRICS_EXPORTER=prometheus) is refused: pass --metrics-port 0 (each job takes a free
port and prints it in its log), or send metrics over OTLP with --otlp-endpoint.
"""


@click.command("sbatch", help=_SBATCH_HELP, context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="INPUT -o OUT [OPTIONS]")
@click.option("--shards", type=int, required=True, help="N: array jobs, one shard each.")
@click.option("--time", "time_limit", help="#SBATCH --time (e.g. 4:00:00).")
@click.option("--partition", help="#SBATCH --partition.")
@click.option("--job-name", default="trollout", show_default=True, help="#SBATCH --job-name.")
@click.option(
    "--sbatch-option",
    "extra",
    multiple=True,
    metavar="OPTION",
    help="Any other #SBATCH option, as written (e.g. --mem=8G). Repeatable.",
)
@click.option(
    "--script",
    type=click.Path(dir_okay=False),
    help="Write the script to this file (default: stdout).",
)
def sbatch(args: tuple[str, ...], shards: int, **opts: Any) -> None:
    try:
        text = _sbatch_text(args, shards, opts)
    except TrolloutError as exc:
        fail(str(exc))
    if opts["script"] is None:
        click.echo(text, nl=False)
        return
    Path(opts["script"]).write_text(text, encoding="utf-8")
    click.echo(f"wrote {opts['script']}; submit it with: sbatch {opts['script']}", err=True)


def _sbatch_text(args: tuple[str, ...], shards: int, opts: dict[str, Any]) -> str:
    if shards < 1:
        raise ConfigError(f"--shards must be at least 1 (got {shards!r}); e.g. --shards 8")
    config = _collect_config(args)
    if config.shard is not None or config.ray_address is not None or config.ray_workers:
        raise ConfigError("the script chooses each job's shard; drop --shard, --ray and --workers")
    if config.overwrite:
        raise ConfigError(
            "every job resumes its shard; drop --overwrite (delete the shards to restart)"
        )
    if not config.output_jsonl_fpath:
        raise ConfigError("no output file: pass -o OUT.jsonl")
    _check_prometheus(config)
    options = [f"--job-name={opts['job_name']}"]
    options += [f"--time={opts['time_limit']}"] if opts["time_limit"] else []
    options += [f"--partition={opts['partition']}"] if opts["partition"] else []
    options += list(opts["extra"])
    return sbatch_script(
        output=Path(config.output_jsonl_fpath).absolute(),
        shards=shards,
        collect_args=_without_output(args),
        python=sys.executable,
        workdir=Path.cwd(),
        sbatch_options=options,
    )


def _check_prometheus(config: RunConfig) -> None:
    """Refuse a fixed Prometheus port: array jobs sharing a node cannot all bind it."""
    watching = telemetry_settings(config)  # the environment the jobs will inherit, as now
    if watching is None or watching.prometheus is None or watching.prometheus[1] == 0:
        return
    port = watching.prometheus[1]
    asked = (
        f"--metrics-port {port!r}"
        if config.metrics_port is not None
        else f"OTEL_METRICS_EXPORTER=prometheus (port {port!r})"
    )
    raise ConfigError(
        f"{asked}: array jobs may share a node, where only the first could bind the port; "
        "pass --metrics-port 0 (any free port, printed in each job's log), or send metrics "
        "over OTLP (--otlp-endpoint)"
    )


def _collect_config(args: tuple[str, ...]) -> RunConfig:
    """Parse ARGS as ``collect`` would, and build its config (usage errors raise)."""
    from .collect import collect

    try:
        ctx = collect.make_context("collect", list(args), resilient_parsing=False)
    except click.UsageError as exc:
        raise ConfigError(f"{exc.format_message()} (in the collect arguments)") from None
    params = dict(ctx.params)
    collect_args = params.pop("args")
    params.pop("live", None)
    options = {k: v for k, v in params.items() if v is not None and v != ()}
    return build_run_config(collect_args, options)


def _without_output(args: tuple[str, ...]) -> list[str]:
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("-o", "--output"):
            skip = True
        elif not arg.startswith(("--output=", "+output_jsonl_fpath=")):
            out.append(arg)
    return out
