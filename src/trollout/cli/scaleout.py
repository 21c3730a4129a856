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
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import click

from ..config import RunConfig
from ..errors import ConfigError, TrolloutError
from ..metrics.batch import status_path
from ..recovery.files import check_replaceable, replace_atomically
from ..recovery.layout import RunLayout
from ..recovery.manifest import read_manifest
from ..recovery.preflight import (
    check_input,
    check_run_paths,
    run_paths,
    same_file,
)
from ..recovery.resume import Resubmit
from ..scaleout.layout import check_shards_root, shard_output, shards_root
from ..scaleout.sbatch import logs_folder, sbatch_script, short_time_warning, submit
from ..telemetry import TelemetrySettings
from ..text import visible
from .common import EXIT_FAILED, build_run_config, fail

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
runs `trollout collect ARGS --shard I/N --resume --no-retry-failed` into OUT's shards folder.
A task stopped at its time limit, by preemption or by `scancel -b --signal=TERM JOB_I` writes
everything down and requeues itself (it never ends FAILED); run again, it resumes its shard.
Plain `scancel` stops a task for good (submit the script again to resume it). Logs are
appended to OUT's shards folder, logs/slurm-JOB_I.out. With --submit the script is submitted
and then a merge job that runs `trollout aggregate` into OUT once every task completed.

Before the script is written, every job's shard gets the checks collect makes before it asks
the deployment (the input, the run folders, OTEL_* settings); the deployment and the rows'
routing are checked by the jobs. A value holding a control character is refused.

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
    help="Write the script to this file (default: stdout). An existing file is refused "
    "unless --overwrite-script; a symlink, or a file the run reads or writes, always is.",
)
@click.option(
    "--overwrite-script",
    is_flag=True,
    help="Replace the --script file if it exists (atomically).",
)
@click.option(
    "--submit",
    is_flag=True,
    help="Submit the script with sbatch (needs --script), then a merge job that runs "
    "`trollout aggregate` once every task completed (afterok); print both job ids.",
)
@click.option(
    "--no-aggregate-job",
    is_flag=True,
    help="With --submit: submit the array only; merge by hand with the script's command.",
)
def sbatch(args: tuple[str, ...], shards: int, **opts: Any) -> None:
    try:
        text, touched, output, warning = _sbatch_text(args, shards, opts)
        script = None if opts["script"] is None else Path(opts["script"])
        if opts["submit"] and script is None:
            raise ConfigError("--submit needs --script FILE (the script Slurm runs is kept)")
        if script is not None:
            _check_script(script, touched, output, overwrite=opts["overwrite_script"])
    except TrolloutError as exc:
        fail(str(exc))
    if warning is not None:
        click.echo(f"warning: {warning}", err=True)
    if script is None:
        click.echo(text, nl=False)
        return
    try:
        logs_folder(output).mkdir(parents=True, exist_ok=True)  # Slurm does not make it
        replace_atomically(script, [text.encode()])
    except OSError as exc:
        fail(
            f"cannot write the script {str(script)!r}: {exc.strerror or exc}; check the folder, "
            "or choose another --script path"
        )
    shown = shlex.quote(visible(str(script)))
    if not opts["submit"]:
        click.echo(f"wrote {shown}; submit it with: sbatch {shown}", err=True)
        return
    try:
        jobs = submit(
            script.absolute(), output=output, shards=shards, python=sys.executable,
            workdir=Path.cwd(), job_name=opts["job_name"], aggregate=not opts["no_aggregate_job"],
        )  # fmt: skip
    except ConfigError as exc:
        fail(str(exc), EXIT_FAILED)
    click.echo(f"submitted array job {jobs.array_job} ({shards} tasks) from {shown}")
    if jobs.aggregate_job is not None:
        click.echo(
            f"submitted merge job {jobs.aggregate_job} (after every task completed) into "
            f"{shlex.quote(visible(str(output)))}"
        )
    click.echo(f"logs: {shlex.quote(visible(str(logs_folder(output))))}")


def _sbatch_text(
    args: tuple[str, ...], shards: int, opts: dict[str, Any]
) -> tuple[str, list[tuple[str, Path]], Path, str | None]:
    """Check the run as each job's ``collect`` would, and return the script and the files
    the run reads or writes (each with how a message names it)."""
    if shards < 1:
        raise ConfigError(f"--shards must be at least 1 (got {shards!r}); e.g. --shards 8")
    config, config_file = _collect_config(args)
    if config.shard is not None or config.ray_address is not None or config.ray_workers:
        raise ConfigError("the script chooses each job's shard; drop --shard, --ray and --workers")
    if config.overwrite:
        raise ConfigError(
            "every job resumes its shard; drop --overwrite (delete the shards to restart)"
        )
    if not config.output_jsonl_fpath:
        raise ConfigError("no output file: pass -o OUT.jsonl")
    output = Path(config.output_jsonl_fpath).absolute()
    watching = _check_jobs(config, output, shards)
    _check_prometheus(config, watching)
    options = [f"--job-name={opts['job_name']}"]
    options += [f"--time={opts['time_limit']}"] if opts["time_limit"] else []
    options += [f"--partition={opts['partition']}"] if opts["partition"] else []
    options += list(opts["extra"])
    text = sbatch_script(
        output=output,
        shards=shards,
        collect_args=_without_output(args),
        python=sys.executable,
        workdir=Path.cwd(),
        sbatch_options=options,
    )
    limits = [o.split("=", 1)[1] for o in options if o.startswith("--time=")]
    warning = short_time_warning(limits[-1], config.grace_s) if limits else None
    return text, _touched(config, config_file, output), output, warning


def _check_jobs(config: RunConfig, output: Path, shards: int) -> TelemetrySettings | None:
    """Run collect's own checks for every job's shard, and the merge's on OUT (read-only).

    Each job is ``collect --shard I/N --resume`` into its shard folder, so each shard gets
    exactly the checks that command runs before it asks the deployment anything
    (`collect.check_before_writing`); the deployment and the rows' routing are checked by the
    jobs, since the head server may be reachable from the compute nodes only. ``trollout
    aggregate`` later writes OUT's run files, so they get the run folder's path checks too.
    """
    from .collect import check_before_writing

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
        _, watching = check_before_writing(job, resuming=True)
    return watching


def _touched(config: RunConfig, config_file: str | None, output: Path) -> list[tuple[str, Path]]:
    """Return the files the run reads or writes outside its shards folder, with their roles."""
    read = [
        ("the input", config.input_jsonl_fpath),
        ("the settings file", config_file),
        ("the prompt config", config.prompt_config),
        ("the batch manifest", config.batch_manifest_fpath),
    ]
    found = [(what, Path(path)) for what, path in read if path]
    if config.batch_manifest_fpath:
        found.append(("the batch status", status_path(Path(config.batch_manifest_fpath))))
    found += [
        ("a file of the merged run", path) for path in run_paths(RunLayout.for_output(output))
    ]
    return found


def _check_script(
    script: Path, touched: list[tuple[str, Path]], output: Path, *, overwrite: bool
) -> None:
    """Refuse a --script path the run uses, a link or special file, or an existing file.

    Raises:
        ConfigError: the path is a file the run reads or writes, or exists without
            ``--overwrite-script``.
        RunFolderError: the path is a symlink or not a regular file (`check_replaceable`).
    """
    shown = str(script)
    for what, path in touched:
        if same_file(script, path):
            raise ConfigError(
                f"--script {shown!r} is {what} {str(path)!r}, which the run reads or writes; "
                "writing the script there would destroy it: choose another --script path"
            )
    folder = shards_root(output)
    if same_file(script, folder) or _resolved(script).is_relative_to(_resolved(folder)):
        raise ConfigError(
            f"--script {shown!r} is inside the shards folder {str(folder)!r}, which the jobs "
            "write; choose another --script path"
        )
    exists = check_replaceable(script, "the --script file", "another --script path")
    if exists and not overwrite:
        raise ConfigError(
            f"--script {shown!r} already exists; pass --overwrite-script to replace it, or "
            "choose another --script path"
        )


def _check_prometheus(config: RunConfig, watching: TelemetrySettings | None) -> None:
    """Refuse a fixed Prometheus port: array jobs sharing a node cannot all bind it.

    ``watching``: the jobs' telemetry, from the environment they will inherit, as now.
    """
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


def _collect_config(args: tuple[str, ...]) -> tuple[RunConfig, str | None]:
    """Parse ARGS as ``collect`` would; return its config and settings file (usage errors raise)."""
    from .collect import collect

    try:
        ctx = collect.make_context("collect", list(args), resilient_parsing=False)
    except click.UsageError as exc:
        raise ConfigError(f"{exc.format_message()} (in the collect arguments)") from None
    params = dict(ctx.params)
    collect_args = params.pop("args")
    params.pop("live", None)
    options = {k: v for k, v in params.items() if v is not None and v != ()}
    config_file = options.get("config_file")
    return build_run_config(collect_args, options), config_file


def _resolved(path: Path) -> Path:
    return Path(os.path.realpath(path))


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
