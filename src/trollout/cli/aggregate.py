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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
import httpx
import orjson
import trio
from rich.console import Console

from ..collector.deployment.discovery import discover
from ..config import DEFAULT_MAX_INPUT_LINE_BYTES, head_server_url, parse_override
from ..errors import ConfigError, DeploymentError
from ..metrics import AggregateOptions, AggregateResult, aggregate_shards, print_report
from ..metrics import resolve_inputs as resolve_globs
from ..metrics.server import Target
from ..nemo_keys import AGGREGATE, BY_NAME, command_line, merge_config_paths, translate
from ..run.deployment import http_client
from ..text import visible
from .failures import EXIT_INCOMPLETE_RETRYABLE, fail

__all__ = ["aggregate"]


def _strs(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _bool(value: Any) -> bool:
    return isinstance(value, bool)


# The settings `aggregate` takes as +key=value (NeMo Gym's RolloutAggregationConfig and more),
# each with its expected type; NeMo Gym keys trollout handles its own way, or lacks, are
# taken by `nemo_keys.translate` first.
_SETTINGS: dict[str, tuple[str, Any]] = {
    "input_glob": ("a glob, or a list of globs", lambda v: isinstance(v, str) or _strs(v)),
    "output_jsonl_fpath": ("a path", lambda v: v is None or isinstance(v, str)),
    "count_failure_classes_as_zero": (
        "a list of failure classes",
        lambda v: v is None or isinstance(v, str) or _strs(v),
    ),
    "count_missing_rollouts_as_zero": ("true or false", lambda v: v is None or _bool(v)),
    "merge_shards": ("true or false", _bool),
    "materialized_inputs_jsonl_fpath": ("a path", lambda v: v is None or isinstance(v, str)),
    "retry_terminal_timeouts": ("true or false", _bool),
    "batch_manifest_fpath": ("a path", lambda v: v is None or isinstance(v, str)),
    "head_server": ("a URL or {host, port}", lambda v: v is None or isinstance(v, str | dict)),
    "served_config_env_allow": ("a list of environment variable names", _strs),
    "seed": ("an integer", lambda v: v is None or (type(v) is int and v >= 0)),
    "max_input_line_bytes": ("an integer >= 1", lambda v: type(v) is int and v >= 1),
    "overwrite": ("true or false", _bool),
}
_PATH_KEYS = frozenset(
    {"input_glob", "output_jsonl_fpath", "materialized_inputs_jsonl_fpath", "batch_manifest_fpath"}
)
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
    if settings["as_json"]:
        click.echo(orjson.dumps(result.to_json(), option=orjson.OPT_INDENT_2).decode())
    else:
        print_report(result, Console(soft_wrap=False))
        _print_files(result)
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


def _settings(args: Sequence[str], opts: dict[str, Any]) -> dict[str, Any]:
    """Merge defaults, config_paths files and the command line, later winning.

    A setting given twice on the command line (an option and its ``+key``) is refused, as for
    collect (`nemo_keys.command_line`).
    """
    overrides = [token for token in args if token.startswith("+")]
    line = command_line(_given(opts), overrides, _LABELS, parse=_override)
    tokens = {key: value for key, (value, label) in line.items() if label == f"+{key}"}
    found = _config_files(tokens)
    values = _DEFAULTS | found | {key: value for key, (value, _) in line.items()}
    values, notes = translate(values, AGGREGATE)
    values.pop("config_paths", None)
    for note in notes:
        click.echo(f"trollout: note: {visible(note)}", err=True)
    unknown = sorted(values.keys() - _SETTINGS.keys())
    if unknown:
        raise ConfigError(f"unknown aggregate setting {unknown[0]!r}; known: {sorted(_SETTINGS)}")
    for key, (expected, accepts) in _SETTINGS.items():
        if key in values and not accepts(values[key]):
            _refuse(key, values[key], expected)
    inputs = _inputs(args, opts, tokens, found)
    return {**opts, **values, "inputs": inputs, "targets": _targets(opts)}


_DEFAULTS: dict[str, Any] = {
    "count_failure_classes_as_zero": None,
    "count_missing_rollouts_as_zero": None,
    "output_jsonl_fpath": None,
    "head_server": None,
    "served_config_env_allow": [],
    "max_input_line_bytes": DEFAULT_MAX_INPUT_LINE_BYTES,
    "seed": None,
    "merge_shards": True,
    "materialized_inputs_jsonl_fpath": None,
    "retry_terminal_timeouts": False,
    "batch_manifest_fpath": None,
    "overwrite": False,
}


# How the options that set a setting are spelled, where it is not --the-key.
_LABELS: dict[str, str] = {
    "output_jsonl_fpath": "-o/--output",
    "served_config_env_allow": "--allow-env",
    "max_input_line_bytes": "--max-line-bytes",
}


def _config_files(tokens: dict[str, Any]) -> dict[str, Any]:
    """Return the aggregate settings of the ``+config_paths`` files (none without it)."""
    if "config_paths" not in tokens:
        return {}
    paths = tokens["config_paths"]
    if not BY_NAME["config_paths"].accepts(paths):
        _refuse("config_paths", paths, BY_NAME["config_paths"].expected)
    return merge_config_paths(paths, AGGREGATE)


def _given(opts: dict[str, Any]) -> dict[str, Any]:
    """Return the settings given as command-line options (an option not given sets nothing)."""
    classes = [c.strip() for text in opts["zero_classes"] for c in text.split(",") if c.strip()]
    given = {
        "count_failure_classes_as_zero": classes or None,
        "count_missing_rollouts_as_zero": opts["zero_missing"],
        "output_jsonl_fpath": opts["output"],
        "head_server": opts["head_server"],
        "served_config_env_allow": list(opts.get("allow_env", ())) or None,
        "seed": opts["seed"],
        "max_input_line_bytes": opts.get("max_line_bytes"),
        "overwrite": opts["overwrite"],
    }
    return {k: v for k, v in given.items() if v is not None}


def _inputs(
    args: Sequence[str], opts: dict[str, Any], tokens: dict[str, Any], found: dict[str, Any]
) -> list[str]:
    """Return the command line's inputs, or else a config file's ``input_glob``."""
    inputs = [a for a in args if not a.startswith("+")] + list(opts["inputs"])
    inputs += _globs(tokens.get("input_glob"))
    if not inputs:
        inputs = _globs(found.get("input_glob"))
    elif "input_glob" in found and "input_glob" not in tokens:
        click.echo(
            f"trollout: note: the config_paths input_glob {visible(repr(found['input_glob']))} "
            "is not used: INPUT on the command line replaces it",
            err=True,
        )
    if not inputs:
        raise ConfigError("no INPUT given; pass a glob such as 'shards/*.jsonl' or +input_glob=...")
    return inputs


def _globs(value: Any) -> list[str]:
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def _refuse(key: str, value: Any, expected: str) -> None:
    raise ConfigError(f"{key} must be {expected} (got {value!r}); fix the value or drop it")


def _override(token: str) -> tuple[str, Any]:
    """Parse ``+key=value``; a path or glob is taken as written (it may hold commas)."""
    key, _, raw = token.lstrip("+").partition("=")
    if key.strip() in _PATH_KEYS and raw and raw[0] not in "[{'\"":
        return key.strip(), raw
    return parse_override(token)


def _targets(opts: dict[str, Any]) -> list[Target]:
    out: list[Target] = []
    for kind, pairs in (("agent", opts["agent_urls"]), ("env", opts["env_urls"])):
        for pair in pairs:
            name, sep, url = pair.partition("=")
            if not sep or not name or not url.startswith(("http://", "https://")):
                raise ConfigError(f"expected NAME=http://host:port, got {pair!r}")
            out.append((name, None, url) if kind == "agent" else (None, name, url))
    return out


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
