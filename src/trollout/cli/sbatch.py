"""`trollout sbatch`: write a Slurm array script that collects a run as N shards.

Every job's shard gets, before the script is written, the checks ``collect`` makes before it
asks the deployment (`trollout.run.checks.check_shard_jobs`); the script itself is
`trollout.scaleout.sbatch`'s. ARGS are parsed exactly as ``collect`` parses them.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import click

from ..errors import ConfigError, TrolloutError
from ..metrics.batch import status_path
from ..recovery.files import replace_atomically
from ..recovery.layout import RunLayout
from ..recovery.preflight import run_paths
from ..run.checks import check_shard_jobs
from ..scaleout.sbatch import logs_folder, sbatch_script, short_time_warning, submit
from ..settings import RunConfig
from ..text import visible
from .failures import EXIT_FAILED, fail
from .run_config import build_run_config
from .sbatch_checks import check_prometheus, check_script

__all__ = ["sbatch"]


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
            check_script(script, touched, output, overwrite=opts["overwrite_script"])
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
    watching = check_shard_jobs(config, output, shards)
    check_prometheus(config, watching)
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
