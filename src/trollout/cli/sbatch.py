"""`trollout sbatch`: write a Slurm array script that collects a run as N shards.

Every job's shard gets, before the script is written, the checks ``collect`` makes before it
asks the deployment (`trollout.run.checks.check_shard_jobs`); the script itself is
`trollout.scaleout.sbatch`'s. ARGS are parsed exactly as ``collect`` parses them.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

import click

from ..errors import ConfigError, TrolloutError
from ..metrics.batch import status_path
from ..recovery.files import check_replaceable, replace_atomically
from ..recovery.layout import RunLayout
from ..recovery.preflight import run_paths, same_file
from ..run.checks import check_shard_jobs
from ..scaleout.layout import shards_root
from ..scaleout.sbatch import sbatch_script
from ..settings import RunConfig
from ..telemetry import TelemetrySettings
from ..text import visible
from .failures import fail
from .run_config import build_run_config

__all__ = ["sbatch"]


_SBATCH_HELP = """Write a Slurm array script that collects a run as N shards.

ARGS are collect's: INPUT -o OUT and any options or +key=value settings. Job I of the array
runs `trollout collect ARGS --shard I/N --resume` into OUT's shards folder; a job stopped at
its time limit leaves a resumable shard, and submitting the script again (or `sbatch
--array=3,5 SCRIPT`) resumes it. When the jobs are done, `trollout aggregate` (its command is
in the script) merges the shards into OUT as one run.

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
def sbatch(args: tuple[str, ...], shards: int, **opts: Any) -> None:
    try:
        text, touched, output = _sbatch_text(args, shards, opts)
        script = None if opts["script"] is None else Path(opts["script"])
        if script is not None:
            _check_script(script, touched, output, overwrite=opts["overwrite_script"])
    except TrolloutError as exc:
        fail(str(exc))
    if script is None:
        click.echo(text, nl=False)
        return
    try:
        replace_atomically(script, [text.encode()])
    except OSError as exc:
        fail(
            f"cannot write the script {str(script)!r}: {exc.strerror or exc}; check the folder, "
            "or choose another --script path"
        )
    shown = shlex.quote(visible(str(script)))
    click.echo(f"wrote {shown}; submit it with: sbatch {shown}", err=True)


def _sbatch_text(
    args: tuple[str, ...], shards: int, opts: dict[str, Any]
) -> tuple[str, list[tuple[str, Path]], Path]:
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
    return text, _touched(config, config_file, output), output


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
