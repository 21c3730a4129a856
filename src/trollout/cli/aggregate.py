"""``trollout aggregate``: merge shards, compute honest metrics, write the report.

Accepts NeMo Gym's spelling too: ``+input_glob=... +output_jsonl_fpath=...
+count_failure_classes_as_zero=[a,b] +count_missing_rollouts_as_zero=true``. Server metrics are
asked for only with ``--head-server`` / ``--agent-url`` / ``--environment-server-url``; without
them (or with no server running) metrics are computed locally.

Settings come from, lowest first: defaults, ``+config_paths`` files, command-line options and
INPUTs, ``+key=value`` tokens (as in NeMo Gym, where Hydra overrides beat config files). The
inputs are the command line's (INPUT, ``-i``, ``+input_glob``) or else a config file's
``input_glob``.

Exit codes: 0 done; 1 a server's ``/aggregate_metrics`` failed (everything else was written);
75 planned rollouts have no outcome row (never started, cut short, or a kill-shaped reply: rows
went in and fewer came out) that no ``count_missing_rollouts_as_zero`` scores: one error line
says how many, everything was written, and ``trollout resume`` of their shard runs them; 2 a
usage error (bad option, bad input line, a line over the line limit, a shard that holds no row,
rows that would be lost, an output that is an input or a file trollout did not write,
unreachable head server), with nothing written.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import httpx
import orjson
import trio
from rich.console import Console

from ..collector.deployment.discovery import discover
from ..errors import ConfigError, DeploymentError
from ..metrics import AggregateOptions, AggregateResult, aggregate_shards, print_report
from ..metrics import resolve_inputs as resolve_globs
from ..metrics.server import Target
from ..run.deployment import http_client
from ..run.health import after_run
from ..settings import head_server_url
from ..text import visible
from .aggregate_settings import _settings
from .failures import EXIT_INCOMPLETE_RETRYABLE, fail
from .health_options import health_options
from .view import view_command

__all__ = ["aggregate"]


_HELP = """Merge rollouts shards and compute metrics that say what they cover.

INPUT is a rollouts file, a glob, or comma-separated globs (quote them); sidecars and
materialized inputs are found beside each shard and never taken as shards. Shards are read in
sorted order, those with materialized inputs first. Shards of separate runs (each numbering its
tasks from 0, as NeMo Gym's --no-serve +disable_aggregation=true chunks do) merge without
loss: a rollout is known by its task's content (its materialized row, or its landed rows'
responses_create_params, without the collector's stamps and any seed) and agent, plus its
rollout index, so the same rollout in two shards (a copy, even of the rollouts file alone, a
re-run chunk, a merged output merged again) counts once, the first landed row read winning,
and tasks first seen in a later shard are renumbered in the merged files. A landed row beats
any failure of the same rollout; a file identical to one already read is skipped unless its
shard has other materialized inputs. Every NeMo Gym aggregation setting is taken as +key=value
(+merge_shards=false, +materialized_inputs_jsonl_fpath=..., +batch_manifest_fpath=..., ...).

Writes OUTPUT (the merged rollouts, with merged sidecars), <stem>_aggregate_metrics.json and
<stem>_report.html beside it; without -o, one shard's metrics are written beside it. Files at
OUTPUT that an earlier aggregation wrote are replaced; any other file there only with
--overwrite. Each shard's <stem>_batch_status.json is marked with the outcome (as NeMo Gym
does), except in a folder that cannot be written or whose collector is still running: those
are skipped with a warning.
"""


@click.command("aggregate", help=_HELP, context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="[INPUT]... [+key=value]...")
@click.option("-i", "--input", "inputs", multiple=True, help="A shard glob (repeatable).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Merged rollouts file.")
@click.option(
    "--count-failure-classes-as-zero",
    "zero_classes",
    multiple=True,
    metavar="CLASS[,CLASS]",
    help="Failure classes whose latest row counts as reward 0 in the metrics.",
)
@click.option(
    "--count-missing-rollouts-as-zero",
    "zero_missing",
    is_flag=True,
    default=None,
    help="Planned rollouts with no row count as reward 0 in the metrics.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@health_options
@click.option("--no-report", is_flag=True, help="Do not write <stem>_report.html.")
@click.option("--seed", type=int, default=None, help="Bootstrap seed (default 0).")
@click.option(
    "--max-line-bytes",
    type=int,
    default=None,
    help="Refuse shard lines longer than this many bytes (default 64 MiB; +max_input_line_bytes).",
)
@click.option(
    "--overwrite",
    is_flag=True,
    default=None,
    help="Replace files at OUTPUT that trollout did not write (+overwrite=true).",
)
@click.option(
    "--bootstrap-samples",
    type=click.IntRange(min=0),
    default=1000,
    show_default=True,
    help="Resamples per confidence interval (0: normal approximation).",
)
@click.option("--head-server", help="Ask this deployment's servers for /aggregate_metrics.")
@click.option(
    "--allow-env",
    multiple=True,
    metavar="NAME",
    help="Let the head server's config read environment variable NAME (repeatable; none by "
    "default, as for collect).",
)
@click.option(
    "--agent-url",
    "agent_urls",
    multiple=True,
    metavar="NAME=URL",
    help="Ask agent NAME at URL for /aggregate_metrics (repeatable).",
)
@click.option(
    "--environment-server-url",
    "env_urls",
    multiple=True,
    metavar="NAME=URL",
    help="Ask environment server NAME at URL for /aggregate_metrics (repeatable).",
)
def aggregate(args: tuple[str, ...], **opts: Any) -> None:
    try:
        settings = _settings(args, opts)
        shards = resolve_globs(settings["inputs"])
        result = trio.run(_run, shards, settings)
    except (ConfigError, DeploymentError) as exc:
        fail(str(exc))
    for warning in result.warnings:
        click.echo(f"trollout: warning: {visible(warning)}", err=True)
    checked = [result.merged_path] if result.merged_path else list(result.inputs.shards)
    health = after_run(checked, result.metrics_path.parent, settings, result)
    if settings["as_json"]:
        document = {**result.to_json(), "health": health}
        click.echo(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode())
    else:
        print_report(result, Console(soft_wrap=False))
        _print_files(result)
        for line in health:
            click.echo(visible(line))
    unsettled = result.coverage.without_outcome()
    if unsettled:
        coverage = result.coverage
        detail = ", ".join(f"{reason} {count}" for reason, count in sorted(unsettled.items()))
        click.echo(
            f"trollout: error: {sum(unsettled.values())} of {coverage.expected} planned rollouts "
            f"have no outcome ({detail}): the metrics cover {coverage.covered}; run them with "
            "trollout resume SHARD (trollout status SHARD shows what each lacks), or score them "
            "as 0 with --count-missing-rollouts-as-zero",
            err=True,
        )
    if not result.ok:
        fail(
            f"{len(result.server_errors)} /aggregate_metrics call(s) failed; "
            "local metrics and the report were written",
            1,
        )
    if unsettled:
        sys.exit(EXIT_INCOMPLETE_RETRYABLE)


def _options(settings: dict[str, Any]) -> AggregateOptions:
    classes = settings["count_failure_classes_as_zero"]
    if isinstance(classes, str):
        classes = [classes]
    manifest = settings["batch_manifest_fpath"]
    return AggregateOptions(
        count_failure_classes_as_zero=frozenset(classes) if classes is not None else None,
        count_missing_rollouts_as_zero=bool(settings["count_missing_rollouts_as_zero"]),
        bootstrap_samples=settings["bootstrap_samples"],
        seed=int(settings["seed"] or 0),
        write_report=not settings["no_report"],
        batch_manifest=Path(manifest) if manifest else None,
        retry_terminal_timeouts=settings["retry_terminal_timeouts"],
        max_line_bytes=settings["max_input_line_bytes"],
    )


async def _run(shards: list[Path], settings: dict[str, Any]) -> AggregateResult:
    output = settings["output_jsonl_fpath"]
    targets: list[Target] = list(settings["targets"])
    async with http_client(connect_timeout_s=10.0, read_timeout_s=600.0) as client:
        if settings["head_server"]:
            allow = settings["served_config_env_allow"]
            targets += await _discover(client, settings["head_server"], allow)
        plan = settings["materialized_inputs_jsonl_fpath"]
        return await aggregate_shards(
            shards,
            output=Path(output) if output else None,
            options=_options(settings),
            targets=targets,
            client=client,
            merge_shards=settings["merge_shards"],
            plan=Path(plan) if plan else None,
            overwrite=settings["overwrite"],
        )


async def _discover(client: httpx.AsyncClient, head: Any, allow: list[str]) -> list[Target]:
    if isinstance(head, dict):
        head = head_server_url(head)
    try:
        deployment = await discover(client, str(head), env_allow=allow)
    except DeploymentError as exc:
        raise DeploymentError(f"{exc} (or drop --head-server to aggregate locally)") from exc
    return list(deployment.aggregate_metrics_targets())


def _print_files(result: AggregateResult) -> None:
    written = [result.merged_path, result.metrics_path, result.report_path]
    click.echo("wrote " + ", ".join(visible(str(p)) for p in written if p is not None), err=True)
    runs = [result.merged_path] if result.merged_path else result.inputs.shards
    click.echo(f"view: {visible(view_command(*runs))}", err=True)
